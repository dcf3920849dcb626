"""Skips are honest: a page's block is skipped in CI only for a reason from a short fixed list.

A block that CI could run must run. The reasons a block may not: it needs hardware or a
cluster this machine does not have (GPUs, an Apple-silicon Mac), root and the SLURM
packages (skipped only where they are missing), the internet (nothing is downloaded in
CI), or it starts a server that runs until stopped.
"""

from __future__ import annotations

import re
from pathlib import Path

from helpers import ROOT

REASONS = {
    "needs GPUs",
    "needs an Apple-silicon Mac",
    "needs root and Debian's slurm-wlm and munge: make setup installs them when run as root",
    "needs the internet",
    "starts a server that runs until you stop it",
}
MARK = re.compile(r"<!--\s*pytest\.mark\.(?P<kind>skip|skipif|xfail)\((?P<args>.*?)\)\s*-->")
REASON = re.compile(r"""reason=(?P<q>["'])(?P<reason>.*?)(?P=q)""")


def marks(text: str) -> list[tuple[int, str, str | None]]:
    """(line, kind, reason) of every pytest mark on a page."""
    found = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        for m in MARK.finditer(line):
            reason = REASON.search(m["args"])
            found.append((lineno, m["kind"], reason["reason"] if reason else None))
    return found


def problems(text: str) -> list[str]:
    return [
        f"line {lineno}: {kind} with reason {reason!r}: not one of the allowed reasons"
        for lineno, kind, reason in marks(text)
        if kind == "xfail" or reason not in REASONS
    ]


def test_every_skip_on_a_page_has_an_allowed_reason() -> None:
    found = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        found += [f"{page.relative_to(ROOT)}:{p}" for p in problems(page.read_text("utf-8"))]
    assert not found, "\n".join(found) + f"\nallowed: {sorted(REASONS)}"


def test_the_parser_finds_the_pages_marks() -> None:
    counts = {reason: 0 for reason in REASONS}
    for page in (ROOT / "docs").rglob("*.md"):
        for _, _, reason in marks(page.read_text("utf-8")):
            counts[reason] = counts.get(reason, 0) + 1
    assert counts["needs GPUs"] > 0  # the parser finds the marks at all


def test_self_check(tmp_path: Path) -> None:
    page = (
        '<!--pytest.mark.skip(reason="needs GPUs")-->\n'
        '<!--pytest.mark.skip(reason="a 20-second timing run")-->\n'
        "    <!--pytest.mark.skipif(True, reason='needs the internet')-->\n"
        "<!--pytest.mark.skip()-->\n"
        '<!--pytest.mark.xfail(reason="needs GPUs")-->\n'
    )
    assert [p.split(":")[0] for p in problems(page)] == ["line 2", "line 4", "line 5"]
