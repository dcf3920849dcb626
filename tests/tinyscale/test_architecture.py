"""The package's architecture (ARCHITECTURE.md): topic folders, the import rule, the chapter maps.

- Every module sits in a topic folder; nothing but __init__.py at the package's top.
- Imports flow one way: core <- comm <- data_parallel, model_parallel <- composed <- compat, and
  core <- low_precision <- compat; ops may import any of them and nothing imports ops.
  Read from every module's `import` statements with `ast` (function-level imports count
  too).
- Each folder's __init__.py re-exports nothing, and its docstring is its chapter map: every
  module of the folder listed once, with the pages that show it; a listed page exists and
  includes that module, and every page that includes the module is listed.
- The test_self_check_* tests prove each check can fail.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from helpers import ROOT

PACKAGE = ROOT / "code" / "tinyscale"
# folder -> the folders it may import (itself always allowed)
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "comm": {"core"},
    "data_parallel": {"core", "comm"},
    "model_parallel": {"core", "comm"},
    "low_precision": {"core"},
    "composed": {"core", "comm", "data_parallel", "model_parallel"},
    "compat": {"core", "comm", "data_parallel", "model_parallel", "low_precision", "composed"},
    "workflows": {"core", "comm", "data_parallel", "model_parallel", "low_precision"},
    "ops": {
        "core",
        "comm",
        "data_parallel",
        "model_parallel",
        "low_precision",
        "composed",
        "compat",
        "workflows",
    },
}
MAP_ROW = re.compile(r"^    (?P<module>[a-z_0-9]+) +(?P<pages>\S+\.md(?:, \S+\.md)*)$")


def folders() -> list[Path]:
    return sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())


def imported_topics(source: str) -> set[tuple[str, int]]:
    """(topic folder, line) of every tinyscale import in a module's source."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "tinyscale" and len(parts) > 1 and parts[1] in ALLOWED:
                found.add((parts[1], node.lineno))
    return found


def rule_breaks(topic: str, source: str) -> list[str]:
    allowed = ALLOWED[topic] | {topic}
    return [f"line {line}: imports tinyscale.{other}" for other, line in
            sorted(imported_topics(source)) if other not in allowed]  # fmt: skip


def chapter_map(init_source: str) -> dict[str, list[str]]:
    """module -> pages, from the rows of an __init__.py docstring."""
    doc = ast.get_docstring(ast.parse(init_source), clean=False) or ""
    rows: dict[str, list[str]] = {}
    for line in doc.splitlines():
        m = MAP_ROW.match(line)
        if m:
            rows.setdefault(m["module"], []).extend(m["pages"].split(", "))
    return rows


def pages_showing(module: Path) -> set[str]:
    target = f'--8<-- "{module.relative_to(ROOT).as_posix()}'
    return {
        page.relative_to(ROOT / "docs").as_posix()
        for page in (ROOT / "docs").rglob("*.md")
        if target in page.read_text("utf-8")
    }


# --- the repository ----------------------------------------------------------------------


def test_every_module_sits_in_a_topic_folder() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules at the top of code/tinyscale/: {loose}; move them to a topic"
    assert {p.name for p in folders()} <= set(ALLOWED), "a folder that ALLOWED does not know"


def test_imports_flow_one_way() -> None:
    problems = []
    for folder in folders():
        for module in sorted(folder.glob("*.py")):
            for problem in rule_breaks(folder.name, module.read_text("utf-8")):
                problems.append(f"{module.relative_to(ROOT)}: {problem}")
    assert not problems, "imports against the rule in ARCHITECTURE.md:\n" + "\n".join(problems)


def test_folders_re_export_nothing() -> None:
    for folder in folders():
        tree = ast.parse((folder / "__init__.py").read_text("utf-8"))
        code = [node for node in tree.body if not isinstance(node, ast.Expr)]
        assert not code, f"{folder.name}/__init__.py holds more than its docstring"


@pytest.mark.parametrize("folder", [p.name for p in folders()])
def test_the_chapter_map_lists_every_module_with_its_pages(folder: str) -> None:
    rows = chapter_map((PACKAGE / folder / "__init__.py").read_text("utf-8"))
    modules = {p.stem: p for p in (PACKAGE / folder).glob("*.py") if p.stem != "__init__"}
    assert set(rows) == set(modules), (
        f"{folder}/__init__.py maps {sorted(set(rows) - set(modules))} that do not exist "
        f"and misses {sorted(set(modules) - set(rows))}"
    )
    for name, pages in rows.items():
        shown = pages_showing(modules[name])
        assert set(pages) == shown, (
            f"{folder}.{name}: the map says {pages}, pages show it on {sorted(shown)}"
        )


# --- the checks can fail -----------------------------------------------------------------


def test_self_check_the_import_rule() -> None:
    source = "import torch\nfrom tinyscale.core import model\n\ndef f():\n    import tinyscale.ops.hangs\n"
    assert rule_breaks("core", source) == ["line 5: imports tinyscale.ops"]
    assert rule_breaks("ops", source) == []
    assert rule_breaks("comm", "from tinyscale.data_parallel.zero import ZeRO\n") == [
        "line 1: imports tinyscale.data_parallel"
    ]
    assert rule_breaks("compat", "from tinyscale import ops\n") == ["line 1: imports tinyscale.ops"]


def test_self_check_the_chapter_map() -> None:
    init = '"""Title.\n\n    module   taught on\n    zero     week-2/a.md, week-2/b.md\n    ddp      week-1/c.md\n"""\n'
    assert chapter_map(init) == {"zero": ["week-2/a.md", "week-2/b.md"], "ddp": ["week-1/c.md"]}
