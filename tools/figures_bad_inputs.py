"""Write the bad-input table of "How the course is tested" from the tests' own cases.

Run:  python tools/figures_bad_inputs.py        (a few seconds; part of `make figures`)

The cases are tests/scripts/bad_inputs.py's CASES, the list tests/scripts/test_bad_inputs.py
checks: a script of the distributed or the workflows lessons, a bad input, and what is on
disk first. Each runs in this process, in a fresh folder, as torchrun starts rank 0 (or as
plain python): the table gives its command, its exit code and the line it prints.
docs/generated/testing/bad_inputs.md is that table; the test runs every case again and
finds its row there, so a message cannot change without the table.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "scripts")]  # the cases, helpers

from bad_inputs import CASES, Case, make, run  # noqa: E402

OUT = ROOT / "docs" / "generated" / "testing"
HEADER = "| command | exit code | what it prints (stderr) |\n|---|---|---|\n"


def row(case: Case, code: int | None, line: str) -> str:
    """One row: the command (and what is on disk, when it matters), the code, the line."""
    given = f" ({case.given})" if case.given else ""
    cell = line.removesuffix("\n").replace("|", "\\|")
    return f"| ``{case.command}``{given} | {code} | ``{cell}`` |\n"


def table(rows: list[str]) -> str:
    return HEADER + "".join(rows)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        make(folder)
        rows = [row(case, *run(case, folder)[:2]) for case in CASES]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bad_inputs.md").write_text(table(rows))
    print(f"wrote {(OUT / 'bad_inputs.md').relative_to(ROOT)}: {len(rows)} bad inputs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
