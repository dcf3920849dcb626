"""Write the tables of "How the course is tested" from the pages themselves.

Run:  python tools/figures_testing.py        (part of `make figures`)

For every page under docs/, the code blocks that pytest-codeblocks collects: how many
run in `make test`, how many of those have their printed output compared, how many are
skipped and for which reason; and the recorded outputs from docs/generated/ that the
page includes; and the numbers in the pages' sentences, by what ties each to data
(tools/prose_numbers.py). tests/docs/test_testing_page.py rebuilds the tables and
compares them with the files, so the page cannot fall behind the suite.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pytest_codeblocks import extract_from_file

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
OUT = DOCS / "generated" / "testing"
OUTPUTS = [OUT / "pages.md", OUT / "summary.md", OUT / "tests.md", OUT / "prose_numbers.md"]
TESTS = ROOT / "tests"

RUN_SYNTAX = ("python", "sh", "bash")  # the blocks pytest-codeblocks runs; others are text
REASON = re.compile(r"""reason=(["'])(?P<reason>.*?)\1""")
# docs/generated files a page shows: a snippet include or an image link
GENERATED = re.compile(r"""(?:--8<--\s*"|\]\()(?:\.\./)*(?:docs/)?generated/(?P<path>[^")]+)""")
SHORT_REASON = {  # the column headings; tests/docs/test_skips.py holds the full list
    "needs GPUs": "GPUs",
    "needs an Apple-silicon Mac": "Mac",
    "needs the internet": "internet",
    "starts a server that runs until you stop it": "server",
}


@dataclass
class PageCount:
    page: str
    run: int = 0
    compared: int = 0
    root_only: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    generated: set[str] = field(default_factory=set)


def count_page(path: Path, docs: Path = DOCS) -> PageCount:
    """Count one page's blocks as pytest-codeblocks collects them."""
    count = PageCount(page=str(path.relative_to(docs)))
    for block in extract_from_file(path):
        if block.syntax not in RUN_SYNTAX:
            continue
        skip = next((m for m in block.marks if "skip" in m), None)
        if skip is None or "skipif" in skip:  # skipif: SLURM, which make test runs as root
            count.run += 1
            count.compared += block.expected_output is not None
            count.root_only += skip is not None
            continue
        reason = REASON.search(skip)
        text = reason["reason"] if reason else "no reason"
        count.skipped[SHORT_REASON.get(text, text)] += 1
    count.generated = set(GENERATED.findall(path.read_text("utf-8")))
    return count


def count_pages(docs: Path = DOCS) -> list[PageCount]:
    """Every page with at least one code block or recorded output, in path order."""
    pages = sorted(p for p in docs.rglob("*.md") if "generated" not in p.parts)
    counts = [count_page(p, docs) for p in pages]
    return [c for c in counts if c.run or c.skipped or c.generated]


def pages_table(counts: list[PageCount]) -> str:
    """One row per page: blocks run, outputs compared, recorded outputs, skips by reason."""
    lines = [
        "| page | blocks run | of them only as root | outputs compared "
        "| recorded outputs shown | skipped (why) |",
        "|---|--:|--:|--:|--:|---|",
    ]
    for c in counts:
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(c.skipped.items())) or "—"
        link = f"[{c.page}](../{c.page})"
        cells = [link, c.run, c.root_only or "—", c.compared, len(c.generated), skipped]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def summary(counts: list[PageCount]) -> str:
    """The totals, as one sentence the home page and the testing page include."""
    run = sum(c.run for c in counts)
    root_only = sum(c.root_only for c in counts)
    compared = sum(c.compared for c in counts)
    skipped: Counter[str] = Counter()
    for c in counts:
        skipped.update(c.skipped)
    shown = len(set().union(*(c.generated for c in counts)))
    reasons = ", ".join(f"{n} {why}" for why, n in sorted(skipped.items()))
    return (
        f"On {len(counts)} pages, **{run} code blocks run** in `make test` ({root_only} "
        f"of them only as root, where `make setup` can install SLURM) and **{compared}** "
        f"of them have their printed output compared with the page; "
        f"**{sum(skipped.values())}** are skipped ({reasons}); the pages show "
        f"**{shown}** recorded outputs from `docs/generated/`.\n"
    )


def tests_table(tests: Path = TESTS) -> str:
    """One row per folder of tests/: its test files and test functions (before parametrize)."""
    rows: dict[str, list[int]] = {}
    for path in sorted(tests.rglob("test_*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        row = rows.setdefault(str(path.parent.relative_to(tests.parent)), [0, 0])
        row[0] += 1
        row[1] += sum(n.name.startswith("test_") for n in found)
    lines = ["| folder | test files | test functions |", "|---|--:|--:|"]
    lines += [f"| `{folder}/` | {files} | {funcs} |" for folder, (files, funcs) in rows.items()]
    files, funcs = (sum(col) for col in zip(*rows.values(), strict=True))
    lines.append(f"| **all** | **{files}** | **{funcs}** |")
    return "\n".join(lines) + "\n"


def prose_numbers_table() -> str:
    """The numbers in the pages' sentences, by what ties each to data, and by rule."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    import prose_numbers

    report = prose_numbers.check()
    counts = report.counts()
    rules = Counter(n.why for n in report.numbers if n.tie == "rule")
    pages = len({n.page for n in report.numbers})
    rows = [
        ("in a compared output or an included recording of the same page", counts["data"]),
        ("read by a test that compares it with the data", counts["test"]),
        ("a version after the name of what it versions", counts["version"]),
        *((f"by rule, {rule}: {prose_numbers.RULES[rule]}", rules[rule]) for rule in sorted(rules)),
        ("**untied**", counts["untied"]),
    ]
    lines = ["| how the number is tied | numbers |", "|---|--:|"]
    lines += [f"| {how} | {n} |" for how, n in rows]
    lines.append(f"| **all, on {pages} pages** | **{len(report.numbers)}** |")
    return "\n".join(lines) + "\n"


def main() -> int:
    counts = count_pages()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "pages.md").write_text(pages_table(counts))
    (OUT / "summary.md").write_text(summary(counts))
    (OUT / "tests.md").write_text(tests_table())
    (OUT / "prose_numbers.md").write_text(prose_numbers_table())
    print(summary(counts), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
