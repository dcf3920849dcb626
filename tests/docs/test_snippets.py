"""The literate-code contract (ARCHITECTURE.md §5): what the pages show is what code/ holds.

Pages include sections of the modules under code/ with pymdownx.snippets:

    ```python title="code/tinyscale/core/model.py"
    --8<-- "code/tinyscale/core/model.py:attention"
    ```

`check_paths: true` already fails the build on a missing file or section; these tests
also fail when

- an include points at a missing file or an undefined section (reported as page:line,
  without needing a build);
- a file under code/ has a `[start:x]` with no later `[end:x]` (snippets would silently
  include the rest of the file), an `[end:x]` with no start, a section defined twice, or
  a line that mentions `--8<--` but is no valid marker (snippets ignores it);
- an include sits in a fence with no `title=` (pytest-codeblocks runs plain `python`,
  `bash`, `sh` fences, and would execute the include line literally), or outside any
  fence while it includes from code/, or in a fence whose title names another file;
- an include selects lines by number (`file:10:20`): line numbers drift as the code
  changes, named sections do not;
- a non-blank line of a module under code/tinyscale/ or code/scripts/ is shown on no page
  (imports and marker lines aside).

The parsers follow pymdownx.snippets' own patterns (RE_ALL_SNIPPETS, RE_SNIPPET_SECTION,
RE_SNIPPET_FILE) and its section semantics: the first `[start:x]` opens, the first
`[end:x]` after it closes, and marker lines of other sections inside are dropped;
test_sections_agree_with_pymdownx checks that against snippets itself, and the
test_self_check_* tests prove each check can fail.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

# --- patterns (after pymdownx.snippets) -------------------------------------------------

# An inline include (`--8<-- "path"`) or a block delimiter (a line that is only `--8<--`).
RE_INCLUDE = re.compile(
    r"""^(?P<space>[ \t]*)(?P<escape>;*)
    (?:(?P<inline>-+8<-+[ \t]+)(?P<quoted>"(?:\\"|[^"\n\r])+?"|'(?:\\'|[^'\n\r])+?')(?![ \t])
      |(?P<block>-+8<-+)(?![ \t]))\r?$""",
    re.VERBOSE,
)
# A section marker anywhere on a line, after any comment leader: `# --8<-- [start:name]`.
RE_MARKER = re.compile(
    r"""^(?P<pre>.*?)(?<!;)(?!(?<=-)-)(?P<escape>;*)(?P<marker>-+8<-+[ \t]+)
    \[[ \t]*(?P<kind>start|end)[ \t]*:[ \t]*(?P<name>[a-z][-_0-9a-z]*)[ \t]*\]""",
    re.VERBOSE | re.IGNORECASE,
)
# How pymdownx splits a target into path, line ranges and section name.
RE_TARGET = re.compile(
    r"(?i)(?P<path>.*?)(?:(?P<lines>(?::-?[0-9]*){1,2}(?:(?:,(?=[-0-9:])-?[0-9]*)(?::-?[0-9]*)?)*)"
    r"|:(?P<section>[a-z][-_0-9a-z]*))?$"
)
RE_TITLE = re.compile(r"""title=(?P<q>["'])(?P<title>.*?)(?P=q)""")
RE_FENCE = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
SNIP = "8<-"  # every snippet notation contains this

# Fences pytest-codeblocks 0.18 collects and runs (ARCHITECTURE.md §5).
EXECUTED_FENCES = {"python", "bash", "sh"}
# Modules whose every line must appear on some page.
SHOWN_DIRS = ("code/tinyscale", "code/scripts")
SKIP_DIRS = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".ruff_cache"}


# --- data -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Include:
    """One snippet include on a page."""

    lineno: int  # 1-based line of the page
    raw: str  # the target as written, e.g. "code/tinyscale/core/model.py:attention"
    path: str  # "code/tinyscale/core/model.py"
    section: str | None  # "attention", or None for the whole file
    line_ranges: str | None  # ":10:20" if lines were selected by number
    fence_info: str | None  # info string of the enclosing fence; None outside any fence


@dataclasses.dataclass(frozen=True)
class Sections:
    """The sections one file defines, and what is wrong with its markers."""

    spans: dict[str, tuple[int, int]]  # name -> (start marker line, end marker line), 1-based
    problems: list[tuple[int, str]]  # (line, message)


# --- parsing ----------------------------------------------------------------------------


def split_target(target: str) -> tuple[str, str | None, str | None]:
    """`"a/b.py:name"` -> (`"a/b.py"`, `"name"`, None); `"a/b.py:3:9"` -> (path, None, `":3:9"`)."""
    m = RE_TARGET.match(target)
    assert m is not None  # the pattern matches any string
    return m.group("path"), m.group("section"), m.group("lines")


def find_includes(text: str) -> list[Include]:
    """Every include in a page's Markdown, with the info string of the fence around it.

    Snippets is a preprocessor: it expands includes wherever they are, fenced or not, so
    every matching line counts. Both the inline form and the block form are read.
    """
    includes: list[Include] = []
    fence: tuple[str, int, str] | None = None  # (char, length, info) of the open fence
    in_block = False
    for lineno, line in enumerate(text.splitlines(), start=1):
        if SNIP in line:
            m = RE_INCLUDE.match(line)
            if m and not m.group("escape"):
                if m.group("block"):
                    in_block = not in_block
                    continue
                raw = m.group("quoted")[1:-1].strip()
                if not in_block and not raw.startswith(";"):
                    includes.append(_include(lineno, raw, fence))
                continue
        if in_block:
            raw = line.strip()
            if raw and not raw.startswith(";"):
                includes.append(_include(lineno, raw, fence))
            continue
        m = RE_FENCE.match(line)
        if m is None:
            continue
        char, length, info = m.group("fence")[0], len(m.group("fence")), m.group("info").strip()
        if fence is None:
            if not (char == "`" and "`" in info):
                fence = (char, length, info)
        elif char == fence[0] and length >= fence[1] and not info:
            fence = None
    return includes


def _include(lineno: int, raw: str, fence: tuple[str, int, str] | None) -> Include:
    path, section, line_ranges = split_target(raw)
    return Include(lineno, raw, path, section, line_ranges, None if fence is None else fence[2])


def parse_sections(text: str) -> Sections:
    """Sections a file defines, checked the way pymdownx.snippets will read them."""
    spans: dict[str, tuple[int, int]] = {}
    problems: list[tuple[int, str]] = []
    open_at: dict[str, int] = {}
    duplicates: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), start=1):
        if SNIP not in line:
            continue
        m = RE_MARKER.match(line)
        if m is None or m.group("escape"):
            problems.append((lineno, f"mentions --8<-- but is no section marker: {line.strip()!r}"))
            continue
        kind, name = m.group("kind").lower(), m.group("name")
        if kind == "start":
            if name in open_at:
                problems.append(
                    (lineno, f"[start:{name}] again; still open from line {open_at[name]}")
                )
            elif name in spans:
                problems.append(
                    (lineno, f"section {name!r} defined twice (first at line {spans[name][0]})")
                )
                duplicates.add(name)  # its [end:] is part of the same mistake
            else:
                open_at[name] = lineno
        elif name in open_at:
            spans[name] = (open_at.pop(name), lineno)
        elif name in duplicates:
            duplicates.discard(name)
        else:
            problems.append((lineno, f"[end:{name}] with no [start:{name}] before it"))
    for name, lineno in open_at.items():
        problems.append(
            (
                lineno,
                f"[start:{name}] is never closed by [end:{name}] "
                "(snippets would include the rest of the file)",
            )
        )
    return Sections(spans, sorted(problems))


def exempt_lines(text: str) -> set[int]:
    """Lines that need not be shown: blank lines, marker lines, import statements."""
    lines = text.splitlines()
    exempt = {n for n, line in enumerate(lines, start=1) if not line.strip() or SNIP in line}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            exempt.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return exempt


def covered_lines(sections: Sections, includes: Iterable[Include], n_lines: int) -> set[int]:
    """Line numbers of a file that the given includes (all of that file) put on a page."""
    covered: set[int] = set()
    for inc in includes:
        if inc.section is None and inc.line_ranges is None:
            return set(range(1, n_lines + 1))
        if inc.section in sections.spans:
            start, end = sections.spans[inc.section]
            covered.update(range(start + 1, end))
    return covered


def uncovered(text: str, sections: Sections, includes: Iterable[Include]) -> list[tuple[int, str]]:
    """(line, text) of every line that must be shown and is not."""
    lines = text.splitlines()
    shown = covered_lines(sections, includes, len(lines)) | exempt_lines(text)
    return [(n, line) for n, line in enumerate(lines, start=1) if n not in shown]


def include_problems(inc: Include, root: Path) -> list[str]:
    """What is wrong with one include, given the repository root it resolves from."""
    problems: list[str] = []
    target = root / inc.path
    if inc.line_ranges is not None:
        problems.append("selects lines by number; mark a named section in the file instead")
    if not target.is_file():
        problems.append(f"{inc.path} does not exist")
    elif inc.section is not None:
        spans = parse_sections(target.read_text(encoding="utf-8")).spans
        if inc.section not in spans:
            known = ", ".join(sorted(spans)) or "none"
            problems.append(f"{inc.path} defines no section {inc.section!r} (it has: {known})")
    if inc.fence_info is not None and "title=" not in inc.fence_info:
        runs = inc.fence_info.split()[0] in EXECUTED_FENCES if inc.fence_info else False
        why = "pytest-codeblocks would run the include line as code" if runs else "convention"
        problems.append(
            f"sits in a fence ```{inc.fence_info} with no title= ({why}); "
            f'write ```python title="{inc.path}"'
        )
    title = RE_TITLE.search(inc.fence_info or "")
    if title and Path(inc.path).name not in title.group("title"):
        problems.append(f"the fence's title {title.group('title')!r} does not name {inc.path}")
    if inc.fence_info is None and inc.path.startswith("code/"):
        problems.append(f'includes code outside a fence; wrap it in ```python title="{inc.path}"')
    return problems


# --- the repository ---------------------------------------------------------------------


def pages(root: Path) -> list[Path]:
    return sorted((root / "docs").rglob("*.md"))


def all_includes(root: Path) -> list[tuple[Path, Include]]:
    return [(page, inc) for page in pages(root) for inc in find_includes(page.read_text("utf-8"))]


def code_files(root: Path) -> list[Path]:
    """Every text file under code/ that git would keep (tracked or not yet added)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "code"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        files = [root / name for name in out.split("\0") if name]
    except (OSError, subprocess.SubprocessError):  # not a git checkout: walk the tree
        files = [
            p
            for p in (root / "code").rglob("*")
            if not any(part in SKIP_DIRS or part.endswith(".egg-info") for part in p.parts)
        ]
    return sorted(p for p in files if p.is_file() and _is_text(p))


def _is_text(path: Path) -> bool:
    data = path.read_bytes()
    if b"\0" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


# --- tests on the repository ------------------------------------------------------------


def test_pages_exist(root: Path) -> None:
    assert pages(root), "no Markdown pages under docs/"


def test_includes_resolve_and_sit_in_titled_fences(root: Path) -> None:
    problems = [
        f'{rel(page, root)}:{inc.lineno}: --8<-- "{inc.raw}": {problem}'
        for page, inc in all_includes(root)
        for problem in include_problems(inc, root)
    ]
    if problems:
        pytest.fail("bad includes on pages:\n" + "\n".join(problems), pytrace=False)


def test_code_section_markers_are_well_formed(root: Path) -> None:
    files = code_files(root)
    assert files, "no files under code/"
    problems = [
        f"{rel(path, root)}:{lineno}: {message}"
        for path in files
        for lineno, message in parse_sections(path.read_text("utf-8")).problems
    ]
    if problems:
        pytest.fail("bad snippet section markers:\n" + "\n".join(problems), pytrace=False)


def test_every_module_line_is_shown_on_a_page(root: Path) -> None:
    modules = sorted(
        p
        for d in SHOWN_DIRS
        for p in (root / d).rglob("*.py")
        if not SKIP_DIRS.intersection(p.parts)
    )
    assert modules, f"no modules under {SHOWN_DIRS}"
    by_file: dict[str, list[Include]] = {}
    for _, inc in all_includes(root):
        by_file.setdefault(inc.path, []).append(inc)
    missing: list[str] = []
    for path in modules:
        name, text = rel(path, root), path.read_text("utf-8")
        for lineno, line in uncovered(text, parse_sections(text), by_file.get(name, [])):
            missing.append(f"{name}:{lineno}: {line}")
    if missing:
        pytest.fail(
            f"{len(missing)} module lines appear on no page. Put them in a section "
            "(# --8<-- [start:name] ... # --8<-- [end:name]) that a page includes, "
            "or include the whole file:\n" + "\n".join(missing),
            pytrace=False,
        )


def test_sections_agree_with_pymdownx(root: Path) -> None:
    """The line numbers this module counts as shown are the lines snippets really renders."""
    markdown = pytest.importorskip("markdown")
    md = markdown.Markdown(extensions=["pymdownx.snippets"])
    snippets = md.preprocessors["snippet"]
    checked = 0
    for path in code_files(root):
        text = path.read_text("utf-8")
        lines = text.splitlines()
        for name, (start, end) in parse_sections(text).spans.items():
            ours = [lines[n - 1] for n in range(start + 1, end) if SNIP not in lines[n - 1]]
            assert snippets.extract_section(name, lines) == ours, f"{rel(path, root)}:{name}"
            checked += 1
    assert checked, "no sections under code/ to compare"


# --- the checks can fail: a small in-memory example -------------------------------------

EXAMPLE_MODULE = '''\
"""A module."""

from typing import (
    Any,
)
import math

# --8<-- [start:shown]
def shown() -> float:
    # --8<-- [start:inner]
    return math.pi
    # --8<-- [end:inner]
# --8<-- [end:shown]

def hidden(x: Any) -> Any:
    return x

# --8<-- [start:unclosed]
LATE = 1
# --8<-- [end:stray]
# --8<-- [start:shown]
# --8<-- [start: bad name]
'''

EXAMPLE_PAGE = """\
# Page

```python title="code/mod.py"
--8<-- "code/mod.py:shown"
```

=== "Tab"

    ```python
    --8<-- "code/mod.py:nope"
    ```

````markdown
```python title="code/other.py"
--8<-- "code/gone.py"
```
````

;--8<-- "code/escaped.py"

--8<--
code/mod.py:3:4
--8<--

```bash
echo --8<-- "not an include: text after the quote"
```
"""


def test_self_check_sections() -> None:
    sections = parse_sections(EXAMPLE_MODULE)
    assert sections.spans == {"shown": (8, 13), "inner": (10, 12)}
    assert [lineno for lineno, _ in sections.problems] == [18, 20, 21, 22]
    messages = dict(sections.problems)
    assert "never closed" in messages[18]
    assert "no [start:stray]" in messages[20]
    assert "defined twice" in messages[21]
    assert "no section marker" in messages[22]


def test_self_check_includes(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "mod.py").write_text(EXAMPLE_MODULE)
    includes = find_includes(EXAMPLE_PAGE)
    assert [(i.lineno, i.path, i.section, i.line_ranges, i.fence_info) for i in includes] == [
        (4, "code/mod.py", "shown", None, 'python title="code/mod.py"'),
        (10, "code/mod.py", "nope", None, "python"),
        (15, "code/gone.py", None, None, "markdown"),
        (22, "code/mod.py", None, ":3:4", None),
    ]
    problems = {i.lineno: " | ".join(include_problems(i, tmp_path)) for i in includes}
    assert problems[4] == ""
    assert "defines no section 'nope' (it has: inner, shown)" in problems[10]
    assert "pytest-codeblocks would run the include line as code" in problems[10]
    assert "code/gone.py does not exist" in problems[15]
    assert "with no title=" in problems[15]
    assert "by number" in problems[22]
    assert "outside a fence" in problems[22]
    titled = dataclasses.replace(includes[0], fence_info='python title="code/other.py"')
    assert "does not name code/mod.py" in " | ".join(include_problems(titled, tmp_path))


def test_self_check_coverage() -> None:
    sections = parse_sections(EXAMPLE_MODULE)
    include = find_includes(EXAMPLE_PAGE)[0]  # code/mod.py:shown
    # `shown` covers lines 9-12; its nested markers, the imports and blank lines are exempt.
    assert uncovered(EXAMPLE_MODULE, sections, [include]) == [
        (1, '"""A module."""'),
        (15, "def hidden(x: Any) -> Any:"),
        (16, "    return x"),
        (19, "LATE = 1"),
    ]
    # Nothing included: every line but the exempt ones is reported.
    assert [n for n, _ in uncovered(EXAMPLE_MODULE, sections, [])] == [1, 9, 11, 15, 16, 19]
    # A whole-file include covers everything.
    whole = dataclasses.replace(include, section=None)
    assert uncovered(EXAMPLE_MODULE, sections, [whole]) == []


def test_serve_rebuilds_when_an_included_module_changes() -> None:
    """`make serve` watches docs/ by itself; the modules the pages include live in code/."""
    from mkdocs.config import load_config

    from helpers import ROOT

    config = load_config(str(ROOT / "mkdocs.yml"))
    assert ROOT / "code" in {Path(path).resolve() for path in config["watch"]}
