"""python tools/page_times.py [--words PAGE ...] [--measure [PAGE ...]]

How long a page takes: reading time from its words, plus the measured run time of its
code blocks. The top of every workshop and Week page shows it (tools/mkdocs_hooks.py):
the core path (what is not inside a collapsed `???` fold) and the whole page.

- Words are counted from the page as the reader sees it: snippet includes expanded, fold
  titles and markers out. Prose is read at WORDS_PER_MINUTE; code (a fenced block or an
  included module section) at CODE_WORDS_PER_MINUTE, half that rate, since a reader who
  follows a function line by line reads slower than one who reads its explanation. They
  are counted at build time, so they are never stale.
- Run times come from a real run of the page's blocks (`--measure`), recorded per block
  in docs/generated/pages/times.json and keyed by the block's code: a block whose code
  changes needs a new run (tests/docs/test_page_times.py says so), a block that only
  moves keeps its time.

`--words PAGE` prints a page's words and minutes; `--measure` runs the blocks of the
timed pages (or the pages named) under pytest-codeblocks, with three workers as `make test`
runs them, and records them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from figures_testing import RUN_SYNTAX  # the blocks pytest-codeblocks runs, counted once

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RECORD = DOCS / "generated" / "pages" / "times.json"
# Reading rates: definitions, not measurements (the page shows the minutes, not a claim
# about any reader). Code is counted at half the prose rate.
WORDS_PER_MINUTE = 200
CODE_WORDS_PER_MINUTE = 100
# The pages that show their time: the workshop (timed sessions) and the self-paced Weeks.
TIMED = ("workshop/*.md", "week-1/*.md", "week-2/*.md", "week-3/*.md", "week-4/*.md",
         "week-5/*.md")  # fmt: skip
# The minutes each workshop page's core path may take: a session's slides and demo, or
# its lab (Session C's table: 30 + 25 minutes of slides and demos, 35 of lab).
SLOTS = {
    "workshop/session-a.md": 55,
    "workshop/lab-1.md": 35,
    "workshop/session-b.md": 55,
    "workshop/lab-2.md": 35,
    "workshop/session-c.md": 55,
    "workshop/lab-3.md": 35,
}
# Companion pages, read beside a session at the learner's own pace.
COMPANION_MINUTES = 30

INCLUDE = re.compile(r'^(?P<indent>\s*)--8<-- "(?P<path>[^":]+)(?::(?P<section>[^"]+))?"\s*$')
MARKER = re.compile(r"--8<-- \[(?:start|end):[^\]]+\]")
COMMENT = re.compile(r"<!--.*?-->", re.S)
FOLD = re.compile(r"^(?P<indent>\s*)\?\?\? ")  # `???+` is open: it is part of the core path
WORD = re.compile(r"[A-Za-z0-9_]+(?:['’.-][A-Za-z0-9_]+)*")


def timed_pages() -> list[str]:
    """The pages, relative to docs/, that show their time."""
    return sorted(str(p.relative_to(DOCS)) for g in TIMED for p in DOCS.glob(g))


def included(path: str, section: str | None) -> list[str]:
    """The lines a snippet include puts on the page (marker lines left out)."""
    lines = (ROOT / path).read_text().splitlines()
    if section is not None:
        start = next(i for i, s in enumerate(lines) if f"[start:{section}]" in s)
        end = next(i for i, s in enumerate(lines) if f"[end:{section}]" in s)
        lines = lines[start + 1 : end]
    return [s for s in lines if not MARKER.search(s)]


def folded_lines(lines: list[str]) -> set[int]:
    """Indexes of the lines inside a collapsed fold (its title line included)."""
    inside: set[int] = set()
    fold_indent: int | None = None
    for i, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if fold_indent is not None and line.strip() and indent <= fold_indent:
            fold_indent = None
        if fold_indent is None and (m := FOLD.match(line)):
            fold_indent = len(m["indent"])
        if fold_indent is not None:
            inside.add(i)
    return inside


def words(text: str) -> int:
    """The words a reader reads: comments and snippet markers out, code tokens in."""
    return len(WORD.findall(COMMENT.sub(" ", text)))


@dataclass
class PageWords:
    core: int  # prose words of the core path
    total: int  # prose words of the whole page
    core_code: int = 0  # code words (fenced blocks and includes) of the core path
    total_code: int = 0

    def reading_minutes(self, *, core: bool) -> float:
        prose, code = (self.core, self.core_code) if core else (self.total, self.total_code)
        return prose / WORDS_PER_MINUTE + code / CODE_WORDS_PER_MINUTE


FENCE = re.compile(r"^\s*(```|~~~)")


def page_words(page: str) -> PageWords:
    """The words of a page's core path and of the whole page, includes expanded: prose
    and code counted apart, since code is read slower."""
    lines = (DOCS / page).read_text().splitlines()
    folds = folded_lines(lines)
    w = PageWords(0, 0)
    in_code = False
    for i, line in enumerate(lines):
        m = INCLUDE.match(line)
        text = "\n".join(included(m["path"], m["section"])) if m else line
        fence = bool(FENCE.match(line))
        if fence:
            in_code = not in_code
            text = line.strip().lstrip("`~").split(" ")[0]  # the language, not the title
        if FOLD.match(line):
            text = ""  # a fold's title is a link to click, not text to read
        n = words(text)
        if in_code or m or fence:
            w.total_code += n
            w.core_code += 0 if i in folds else n
        else:
            w.total += n
            w.core += 0 if i in folds else n
    return w


def block_key(code: str) -> str:
    """A block's identity in the record: its code, not its line, so it survives moves."""
    return hashlib.sha256(code.encode()).hexdigest()[:16]


@dataclass
class Block:
    line: int  # the line pytest-codeblocks names the block by ("line 20")
    key: str
    folded: bool


def runnable_blocks(page: str) -> list[Block]:
    """The blocks pytest-codeblocks collects on a page, with where they stand."""
    from pytest_codeblocks import extract_from_file

    lines = (DOCS / page).read_text().splitlines()
    folds = folded_lines(lines)
    return [
        Block(b.lineno, block_key(b.code), b.lineno - 1 in folds)
        for b in extract_from_file(DOCS / page)
        if b.syntax in RUN_SYNTAX
    ]


def load_record() -> dict[str, dict[str, float]]:
    """Recorded run time per page and block key, in seconds."""
    return json.loads(RECORD.read_text())["pages"] if RECORD.exists() else {}


@dataclass
class PageTime:
    words: PageWords
    core_run_s: float
    total_run_s: float
    missing: list[int]  # lines of blocks with no recorded time

    @property
    def core_words(self) -> int:
        return self.words.core + self.words.core_code

    @property
    def total_words(self) -> int:
        return self.words.total + self.words.total_code

    @property
    def core_minutes(self) -> int:
        return math.ceil(self.words.reading_minutes(core=True) + self.core_run_s / 60)

    @property
    def total_minutes(self) -> int:
        return math.ceil(self.words.reading_minutes(core=False) + self.total_run_s / 60)

    @property
    def core_reading_minutes(self) -> int:
        return math.ceil(self.words.reading_minutes(core=True))

    @property
    def core_running_minutes(self) -> int:
        return math.ceil(self.core_run_s / 60)


def page_time(page: str, record: dict[str, dict[str, float]] | None = None) -> PageTime:
    """A page's reading and running time, its words counted now, its runs as recorded."""
    record = load_record() if record is None else record
    w = page_words(page)
    times = record.get(page, {})
    core = total = 0.0
    missing = []
    for b in runnable_blocks(page):
        if b.key not in times:
            missing.append(b.line)
            continue
        total += times[b.key]
        core += 0.0 if b.folded else times[b.key]
    return PageTime(w, core, total, missing)


def measure(pages: list[str], report: Path = ROOT / "build" / "page_times.xml") -> None:
    """Run the pages' blocks under pytest-codeblocks and record each block's time."""
    report.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pytest", "--codeblocks", "-q", "-p", "no:cacheprovider"]
    cmd += ["-n", "3", "--dist", "loadgroup", f"--junitxml={report}"]  # as `make test` runs
    cmd += [str(DOCS / p) for p in pages]
    done = subprocess.run(cmd, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"a block failed (exit {done.returncode}): fix it, then measure again")
    record_report(pages, report)


def record_report(pages: list[str], report: Path) -> None:
    """Each block's time from a pytest JUnit report, into the record (other pages kept)."""
    seconds: dict[tuple[str, int], float] = {}
    for case in ET.parse(report).iter("testcase"):
        # "line 20", or "line 20@group" under xdist's loadgroup; the page is the class name
        m = re.fullmatch(r"line (\d+)(?:@.+)?", case.get("name", ""))
        if m:  # "docs.workshop.lab-1.md": the page's path, its slashes written as dots
            page = case.get("classname", "").removesuffix(".md").replace(".", "/") + ".md"
            page = page.removeprefix("docs/")
            seconds[(page, int(m[1]))] = float(case.get("time", 0.0))
    record = load_record()
    for page in pages:
        found = {line: s for (p, line), s in seconds.items() if p == page}
        if not found and runnable_blocks(page):
            raise SystemExit(f"{report} holds no block of {page}: measure it")
        record[page] = {b.key: round(found.get(b.line, 0.0), 1) for b in runnable_blocks(page)}
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps({"pages": dict(sorted(record.items()))}, indent=1) + "\n")
    print(f"wrote {RECORD.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", nargs="+", metavar="PAGE", help="print words and minutes")
    parser.add_argument("--measure", nargs="*", metavar="PAGE", help="run blocks, record times")
    args = parser.parse_args()
    rel = [str((Path.cwd() / p).resolve().relative_to(DOCS)) for p in args.words or []]
    for page in rel:
        t = page_time(page)
        print(
            f"{page}: core {t.core_words} words, {t.core_run_s:.0f} s of runs -> "
            f"{t.core_minutes} min; whole page {t.total_words} words, {t.total_run_s:.0f} s "
            f"-> {t.total_minutes} min; slot {SLOTS.get(page, '-')}; "
            f"blocks without a recorded time at lines {t.missing or 'none'}"
        )
    if args.measure is not None:
        pages = [str((Path.cwd() / p).resolve().relative_to(DOCS)) for p in args.measure]
        measure(pages or timed_pages())


if __name__ == "__main__":
    main()
