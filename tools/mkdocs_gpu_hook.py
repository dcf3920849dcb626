"""mkdocs hook (mkdocs.yml `hooks:`): under each GPU block, what it needs and what a run gave.

Every block the page marks `<!--pytest.mark.skip(reason="needs GPUs")-->` gets one line
after it, at its own indentation (so it stays inside its content tab): how many GPUs the
command needs, then either "Not yet run on a GPU." or the run that `make gpu-check`
recorded for that very command in docs/generated/gpu/<part>__<page-stem>.json (machine,
versions, date, exit code, wall time), with what it printed in a collapsed fold. A page
that names a test which needs CUDA shows that test's recorded outcome the same way.
The blocks, counts and records come from tools/gpu_check.py; the page itself is not edited.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import gpu_check

NOT_RUN = "Not yet run on a GPU."


def machine_text(m: dict[str, Any]) -> str:
    """NVIDIA H200 (1 GPU; driver 570.86, torch 2.14.1, CUDA 13.0, NCCL 2.27.3)."""
    gpus = f"{m['gpus']} GPU{'s' if m['gpus'] != 1 else ''}"
    versions = [
        f"{name} {m[key]}"
        for name, key in (
            ("driver", "driver"),
            ("torch", "torch"),
            ("CUDA", "cuda"),
            ("NCCL", "nccl"),
        )
        if m.get(key)
    ]
    return f"{m['gpu']} ({gpus}; {', '.join(versions)})"


def fence(text: str) -> str:
    """Backticks enough to hold ``text`` in one code block."""
    longest = max((len(r) for r in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def fold(title: str, body: list[str], indent: str, code: bool) -> list[str]:
    """A collapsed note (pymdownx.details), at the block's indentation."""
    inner = indent + "    "
    lines = ["", f'{indent}??? note "{title}"']
    if code:
        text = "\n".join(body)
        lines += [f"{inner}{fence(text)}text"]
        lines += [f"{inner}{line}".rstrip() for line in body] + [f"{inner}{fence(text)}"]
    else:
        lines += [f"{inner}{line}" for line in body]
    return lines


def block_lines(block: gpu_check.GpuBlock, run: dict[str, Any] | None, indent: str) -> list[str]:
    need = gpu_check.need(block)
    needs = need.text() if need else "GPU count not stated"
    if run is None:
        return ["", f"{indent}*{needs}. {NOT_RUN}*"]
    if run["exit_code"] is None:
        outcome = f"stopped at its time limit after {run['wall_s']} s"
    else:
        outcome = f"exit {run['exit_code']} after {run['wall_s']} s"
    badge = f"*{needs}. Run on {machine_text(run['machine'])} on {run['date']}: {outcome}.*"
    tail = run["output_tail"].splitlines() or ["(it printed nothing)"]
    return [
        "",
        f"{indent}{badge}",
        *fold("What that run printed (its last lines)", tail, indent, True),
    ]


def test_lines(tests: list[dict[str, Any]], indent: str) -> list[str]:
    outcomes: dict[str, int] = {}
    for t in tests:
        outcomes[t["outcome"]] = outcomes.get(t["outcome"], 0) + 1
    said = ", ".join(f"{n} {outcome}" for outcome, n in sorted(outcomes.items()))
    last = max(tests, key=lambda t: t["date"])
    badge = (
        f"*The tests that need a GPU, named on this page: {said}, "
        f"run on {machine_text(last['machine'])} on {last['date']}.*"
    )
    body = [f"- `{t['test']}`: {t['outcome']}" for t in tests]
    return ["", f"{indent}{badge}", *fold("Each test and its outcome", body, indent, False)]


def closing_fence(lines: list[str], start: int) -> int:
    """The index of the line that closes the fence opened on lines[start]."""
    opening = lines[start].lstrip()
    ticks = len(opening) - len(opening.lstrip("`"))
    for i in range(start + 1, len(lines)):
        if lines[i].lstrip()[:ticks] == "`" * ticks:
            return i
    raise ValueError(f"the fence on line {start + 1} is not closed")


def annotate(markdown: str, page: str, records: Path = gpu_check.RECORDS) -> str:
    """The page's Markdown with a line (and a fold, for a recorded run) after each GPU block."""
    blocks = gpu_check.blocks_in_text(markdown, page)
    if not blocks:
        return markdown
    path = gpu_check.record_path(page, records)
    record = gpu_check.read_record(path) if path.is_file() else {"blocks": [], "tests": []}
    runs = {entry["command"]: entry for entry in record["blocks"]}
    lines = markdown.split("\n")
    inserts: dict[int, list[str]] = {}
    for block in blocks:
        start = block.lineno - 1
        indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
        inserts[closing_fence(lines, start)] = block_lines(block, runs.get(block.code), indent)
    if record["tests"]:  # after the last GPU block above the first test the page names
        first = min(
            (
                i
                for i, line in enumerate(lines)
                for t in record["tests"]
                if t["test"].split("::")[0] in line
            ),
            default=0,
        )
        above = [b for b in blocks if b.lineno - 1 < first] or blocks[:1]
        start = above[-1].lineno - 1
        indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
        inserts[closing_fence(lines, start)] += test_lines(record["tests"], indent)
    out = []
    for i, line in enumerate(lines):
        out.append(line)
        if i in inserts:
            out += inserts[i]
            if i + 1 < len(lines) and lines[i + 1].strip():
                out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any, **kwargs: Any) -> str:
    return annotate(markdown, page.file.src_uri)
