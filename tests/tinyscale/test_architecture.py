"""The package's architecture (ARCHITECTURE.md): topic folders, the import rule, the chapter maps.

- Every module sits in a topic folder; nothing but __init__.py at the package's top.
- Imports flow one way: core <- comm <- data_parallel, pipeline_parallel, tensor_parallel,
  expert_parallel, context_parallel <- composed <- compat (those five never import each
  other), and
  core <- low_precision <- compat; ops may import any of them and nothing imports ops.
  Read from every module's `import` statements with `ast` (function-level imports count
  too).
- Each folder's __init__.py re-exports nothing, and its docstring is its chapter map: every
  module of the folder listed once, with the pages that show it; a listed page exists and
  includes that module, and every page that includes the module is listed.
- The package is one level deep: a folder of .py files has an __init__.py, no topic folder
  holds another, and no module imports relatively (``from . import x`` names no topic, so
  the import rule could not read it).
- Scripts stay scripts: a function or class that two scripts define (the parts every
  script writes for itself aside, unless their code is the same) and a script over
  SCRIPT_LINES lines are library logic drifting into code/scripts/: it belongs in
  tinyscale/<topic>/.
- The test_self_check_* tests prove each check can fail.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from helpers import ROOT

PACKAGE = ROOT / "code" / "tinyscale"
# A folder per parallelism: each imports core and comm only, never another (composed
# combines them).
PARALLELISMS = {
    "data_parallel",
    "pipeline_parallel",
    "tensor_parallel",
    "expert_parallel",
    "context_parallel",
}
# folder -> the folders it may import (itself always allowed)
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "comm": {"core"},
    **{folder: {"core", "comm"} for folder in sorted(PARALLELISMS)},
    "low_precision": {"core"},
    "composed": {"core", "comm", *PARALLELISMS},
    "compat": {"core", "comm", *PARALLELISMS, "low_precision", "composed"},
    "workflows": {"core", "comm", *PARALLELISMS, "low_precision"},
    "ops": {
        "core",
        "comm",
        *PARALLELISMS,
        "low_precision",
        "composed",
        "compat",
        "workflows",
    },
}
# The parts each script writes for itself: the same name in two scripts, different code.
# The same code under one of these names in two scripts is still a copy.
SCRIPT_PARTS = {"main", "parse_args", "cli", "Run", "check_inputs", "train", "save", "load"}
SCRIPT_LINES = 400  # beyond it a script holds library logic
# Known exceptions, reported to the lead; each goes with its fix, and the test fails once
# one is no longer needed, so none outlives its reason.
LONG_SCRIPTS: dict[str, int] = {}  # none: parallel_train.py is under SCRIPT_LINES now
COPIED_PARTS: dict[str, tuple[str, ...]] = {}  # none: comm.job.run_job replaced cli()
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


def relative_imports(source: str) -> list[str]:
    """``from . import x`` and ``from .x import y``, anywhere in a module (functions too)."""
    return [
        f"line {node.lineno}: from {'.' * node.level}{node.module or ''} import ..."
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]


def layout_breaks(package: Path) -> list[str]:
    """What the one-level layout does not allow: a folder of .py files without an
    __init__.py, and a folder of .py files inside a topic folder."""
    problems = []
    for folder in sorted(p for p in package.iterdir() if p.is_dir()):
        if not any(folder.rglob("*.py")):
            continue  # __pycache__, or data only
        if not (folder / "__init__.py").is_file():
            problems.append(
                f"{folder.name}/ holds .py files but no __init__.py: add one, with its chapter "
                "map (without it the import rule and the maps skip the folder)"
            )
        for inner in sorted(p for p in folder.rglob("*") if p.is_dir()):
            if any(inner.rglob("*.py")):
                problems.append(
                    f"{inner.relative_to(package).as_posix()}/: a package inside a topic folder; "
                    f"the package is one level deep: move its modules into {folder.name}/ "
                    "or make it a topic folder of its own"
                )
    return problems


def script_breaks(
    scripts: dict[str, str],
    *,
    long_scripts: dict[str, int] | None = None,
    copied_parts: dict[str, tuple[str, ...]] | None = None,
) -> list[str]:
    """Library logic in code/scripts/ (file name -> source): a script over SCRIPT_LINES
    lines, a function or class that two scripts define. ``long_scripts`` and
    ``copied_parts`` are the known exceptions to let pass."""
    long_scripts, copied_parts = long_scripts or {}, copied_parts or {}
    problems = []
    defined: dict[str, dict[str, str]] = {}  # name -> "script:line" -> its code
    for script, source in sorted(scripts.items()):
        lines = len(source.splitlines())
        if lines > long_scripts.get(script, SCRIPT_LINES):
            problems.append(
                f"{script}: {lines} lines, over {SCRIPT_LINES}: library logic drifting into the "
                "script; move it into tinyscale/<topic>/"
            )
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                body = node.body[1:] if ast.get_docstring(node) is not None else node.body
                code = ast.dump(ast.Module(body=[*node.decorator_list, *body], type_ignores=[]))
                defined.setdefault(node.name, {})[f"{script}:{node.lineno}"] = code
    for name, places in sorted(defined.items()):
        codes = list(places.values())
        if name in SCRIPT_PARTS:  # each script's own: only the same code twice is a copy
            places = {where: code for where, code in places.items() if codes.count(code) > 1}
        scripts_of = tuple(sorted({where.split(":")[0] for where in places}))
        if len(places) > 1 and copied_parts.get(name) != scripts_of:
            problems.append(
                f"{name} is defined in {', '.join(places)}: library logic drifting into "
                "scripts; move it into tinyscale/<topic>/ and import it in each script"
            )
    return problems


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


def test_the_package_is_one_level_of_topic_folders() -> None:
    problems = layout_breaks(PACKAGE)
    assert not problems, "code/tinyscale/ (ARCHITECTURE.md §2):\n" + "\n".join(problems)


def test_no_module_imports_relatively() -> None:
    problems = [
        f"{module.relative_to(ROOT)} {problem}: import by full name "
        "(from tinyscale.<topic>.<module> import ...)"
        for module in sorted(PACKAGE.rglob("*.py"))
        for problem in relative_imports(module.read_text("utf-8"))
    ]
    assert not problems, "relative imports:\n" + "\n".join(problems)


def test_scripts_hold_no_library_logic() -> None:
    scripts = {p.name: p.read_text("utf-8") for p in (ROOT / "code" / "scripts").glob("*.py")}
    problems = script_breaks(scripts, long_scripts=LONG_SCRIPTS, copied_parts=COPIED_PARTS)
    assert not problems, "code/scripts/:\n" + "\n".join(problems)
    unexcused = "\n".join(script_breaks(scripts))
    for script in LONG_SCRIPTS:
        assert f"{script}: " in unexcused, f"{script} is short now: drop it from LONG_SCRIPTS"
    for name in COPIED_PARTS:
        assert f"{name} is defined in" in unexcused, f"drop {name} from COPIED_PARTS"


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
    assert rule_breaks(
        "tensor_parallel", "from tinyscale.pipeline_parallel.p2p import StageLink\n"
    ) == ["line 1: imports tinyscale.pipeline_parallel"]


def test_self_check_the_chapter_map() -> None:
    init = '"""Title.\n\n    module   taught on\n    zero     week-2/a.md, week-2/b.md\n    ddp      week-1/c.md\n"""\n'
    assert chapter_map(init) == {"zero": ["week-2/a.md", "week-2/b.md"], "ddp": ["week-1/c.md"]}


def test_self_check_relative_imports() -> None:
    source = "import os\nfrom tinyscale.core import model\nfrom . import zero\n\ndef f():\n    from .ddp import NaiveDDP\n"
    assert relative_imports(source) == ["line 3: from . import ...", "line 6: from .ddp import ..."]
    assert relative_imports("from ..core.model import TinyTransformer\n") == [
        "line 1: from ..core.model import ..."
    ]
    assert relative_imports("from tinyscale.core.model import TinyTransformer\n") == []


def test_self_check_the_layout(tmp_path: Path) -> None:
    for path in ("core/__init__.py", "core/model.py", "core/data/loader.md", "README.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    assert layout_breaks(tmp_path) == []  # data in a subfolder is not a package
    (tmp_path / "loose").mkdir()
    (tmp_path / "loose" / "helpers.py").write_text("")
    (tmp_path / "core" / "attention").mkdir()
    (tmp_path / "core" / "attention" / "flash.py").write_text("")
    assert layout_breaks(tmp_path) == [
        "core/attention/: a package inside a topic folder; the package is one level deep: "
        "move its modules into core/ or make it a topic folder of its own",
        "loose/ holds .py files but no __init__.py: add one, with its chapter map (without "
        "it the import rule and the maps skip the folder)",
    ]


def test_self_check_scripts() -> None:
    helper = "def shard(x):\n    return x[::2]\n"
    a = f"{helper}\ndef main():\n    return 0\n"
    b = f"{helper}\ndef main():\n    return 1\n"
    assert script_breaks({"a.py": a}) == []
    assert script_breaks({"a.py": a, "b.py": b}) == [  # main is each script's own
        "shard is defined in a.py:1, b.py:1: library logic drifting into scripts; "
        "move it into tinyscale/<topic>/ and import it in each script"
    ]
    c = "def main():\n    return 0\n"  # main, the same code as a.py's: a copy
    assert script_breaks({"a.py": a, "c.py": c}) == [
        "main is defined in a.py:4, c.py:1: library logic drifting into scripts; "
        "move it into tinyscale/<topic>/ and import it in each script"
    ]
    assert script_breaks({"a.py": a, "c.py": c}, copied_parts={"main": ("a.py", "c.py")}) == []
    long = "x = 1\n" * (SCRIPT_LINES + 1)
    assert script_breaks({"long.py": long}) == [
        f"long.py: {SCRIPT_LINES + 1} lines, over {SCRIPT_LINES}: library logic drifting "
        "into the script; move it into tinyscale/<topic>/"
    ]
    assert script_breaks({"long.py": long}, long_scripts={"long.py": SCRIPT_LINES + 1}) == []
