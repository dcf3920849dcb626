"""Fixtures every test may use. Tests mirror code/: tests/tinyscale/<topic>, tests/scripts,
tests/docs; shared helpers are in helpers.py, each topic's fixtures in its own conftest.py."""

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from helpers import ROOT, load_script

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


@pytest.fixture
def process_group_of_one(tmp_path: Path) -> Iterator[None]:
    """A gloo process group of this process alone (rank 0 of 1), left after the test."""
    store = dist.FileStore(str(tmp_path / "process-group-store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


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
