"""Fixtures every test may use. Tests mirror code/: tests/tinyscale/<topic>, tests/scripts,
tests/docs; shared helpers are in helpers.py, each topic's fixtures in its own conftest.py."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from helpers import ROOT, load_script

os.environ.setdefault("TINYSCALE_CACHE", str(ROOT / ".cache" / "tinyscale"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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


LAB1_STEPS = 200  # of the full run's 414: what the resume tests compare with


@pytest.fixture(scope="session")
def lab1_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first LAB1_STEPS steps of the Lab 1 command, once per session, in-process.

    ``--max-steps`` keeps the 2-epoch schedule, so these are the first records of the full
    run (which Lab 1's page runs and compares). Returns the output directory
    (checkpoints/, metrics.jsonl, tensorboard/, loss_curve.png).
    """
    out = tmp_path_factory.mktemp("lab1")
    script = load_script("train_tiny_transformer")
    args = ["--epochs", "2", "--max-steps", str(LAB1_STEPS), "--output-dir", str(out)]
    assert script.main([*args, "--no-progress"]) == 0
    return out
