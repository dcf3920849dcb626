"""Fixtures of the data_parallel tests: one launch per world size, and the DDP benchmark.

A test module that defines ``multi_rank_facts(full: bool) -> dict`` (everything that needs
a process group, run on every rank) gets its ranks' facts from ``world2`` (with
``full=True``: the extra checks) and ``world4``, each launched once for the module.
Plain helpers the modules share are in ddp_helpers.py, imported by name.
"""

import importlib.util
import sys
from types import ModuleType

import pytest

from helpers import ROOT, TIMEOUTS
from tinyscale.comm.launch import run_on_ranks

DEADLINE_S = 240  # a launch runs every check of its module


def launch(request: pytest.FixtureRequest, world: int) -> list[dict]:
    facts = request.module.multi_rank_facts
    return run_on_ranks(facts, world, world == 2, **{**TIMEOUTS, "deadline_s": DEADLINE_S})


@pytest.fixture(scope="module")
def world2(request: pytest.FixtureRequest) -> list[dict]:
    """The module's multi_rank_facts(True) on 2 ranks: every rank's facts."""
    return launch(request, 2)


@pytest.fixture(scope="module")
def world4(request: pytest.FixtureRequest) -> list[dict]:
    """The module's multi_rank_facts(False) on 4 ranks: every rank's facts."""
    return launch(request, 4)


@pytest.fixture(scope="session")
def bench_ddp() -> ModuleType:
    """benchmarks/bench_ddp.py, imported as ``bench_ddp``: the name its spawned ranks use."""
    spec = importlib.util.spec_from_file_location("bench_ddp", ROOT / "benchmarks" / "bench_ddp.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_ddp"] = bench
    spec.loader.exec_module(bench)
    return bench
