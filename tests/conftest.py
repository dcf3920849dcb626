"""Shared fixtures. Tests mirror code/: tests/tinyscale, tests/scripts, tests/docs."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TINYSCALE_CACHE", str(ROOT / ".cache" / "tinyscale"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Session C's page starts the course's SLURM cluster (make cluster-up, state in build/slurm)
# and stops it in its last code block. If a block in between fails, stop it at the end of
# the session — only when this session started it.
SLURM_STATE = ROOT / "build" / "slurm"
SLURM_WAS_UP = (SLURM_STATE / "pid").exists()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not SLURM_WAS_UP and (SLURM_STATE / "pid").exists():
        subprocess.run(
            ["bash", str(ROOT / "tools" / "slurm" / "cluster.sh"), "down"],
            capture_output=True,
            timeout=120,
        )


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
