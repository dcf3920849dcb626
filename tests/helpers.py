"""Helpers the tests share, imported by name (``from helpers import ROOT``).

A module, not conftest.py: each topic folder of tests/ has its own conftest.py for its
fixtures, and ``from helpers import ...`` would depend on which one Python found first.
"""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tinyscale.core.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
# run_on_ranks' bounds, spelled out: every wait bounded, so a hang fails the test
TIMEOUTS = {"timeout_s": 30.0, "deadline_s": 120.0}


def load_script(name: str) -> ModuleType:
    """Import code/scripts/<name>.py as a module (code/scripts is not a package)."""
    path = ROOT / "code" / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"tinyscale_scripts.{name}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def recorded_output(page: str, after: str) -> list[str]:
    """The lines, unindented, of the first ```text block after ``after`` in docs/<page>.

    That block is the output the page records for the command before it; CI runs the
    command and compares, so tests may check the recorded numbers against the formulas.
    """
    text = (ROOT / "docs" / page).read_text()
    text = text[text.index(after) :]
    start = text.index("```text\n") + len("```text\n")
    return [line.strip() for line in text[start : text.index("```", start)].splitlines()]


def one_line_error(fn: Any, *args: Any, **kwargs: Any) -> str:
    """The message of the UsageError ``fn(*args, **kwargs)`` raises, checked to be one line."""
    with pytest.raises(UsageError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert message and "\n" not in message, f"not one line: {message!r}"
    return message
