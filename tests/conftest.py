"""Shared fixtures. Tests mirror code/: tests/tinyscale, tests/scripts, tests/docs."""

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TINYSCALE_CACHE", str(ROOT / ".cache" / "tinyscale"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def load_script(name: str) -> ModuleType:
    """Import code/scripts/<name>.py as a module (code/scripts is not a package)."""
    path = ROOT / "code" / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"tinyscale_scripts.{name}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def lab1_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Lab 1 command, run once per session in-process: --epochs 2, default everything else.

    Returns the output directory (checkpoints/, metrics.jsonl, tensorboard/, loss_curve.png).
    """
    out = tmp_path_factory.mktemp("lab1")
    script = load_script("train_tiny_transformer")
    assert script.main(["--epochs", "2", "--output-dir", str(out), "--no-progress"]) == 0
    return out
