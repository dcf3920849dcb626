"""How pytest runs this repository's tests and pages: loaded for tests/ and docs/ alike.

`make test` runs ``pytest --codeblocks -n 3 --dist loadgroup tests docs``. This file
decides which tests must share a worker, reports a failed page block readably, and stops
the SLURM cluster a failed page left running. Fixtures are in tests/conftest.py.
"""

import json
import os
import platform
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

# The same kernel choice as `make test` (see the Makefile) when pytest is run by hand,
# set before torch is imported here or in any process a test starts.
if platform.machine() == "x86_64":
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
    os.environ.setdefault("MKL_CBWR", "AVX2")
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
# Threads that sleep while they wait: the suite runs several processes per core (Makefile).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# One thread per process, as the recorded outputs were made (Makefile: the last digits of
# a loss depend on the thread count).
os.environ["OMP_NUM_THREADS"] = "1"

import pytest
from pytest_codeblocks.plugin import TestBlock

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tests"))  # tests/helpers.py, shared with the tests
# Python processes start faster (tests/startup/sitecustomize.py: rarer full garbage
# collections, torch._dynamo imported only once something compiles):
# `make test` puts the folder on PYTHONPATH; a bare pytest does it here, for itself and
# for every process it starts.
STARTUP = ROOT / "tests" / "startup"
if str(STARTUP) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(STARTUP), os.environ.get("PYTHONPATH")])
    )
    runpy.run_path(str(STARTUP / "sitecustomize.py"))
from helpers import SHARED_ON_PURPOSE, SLURM_COMMANDS, masked, places  # noqa: E402
from suite_budget import over_budget, slowest, unit_of  # noqa: E402

# Session C's page starts the course's SLURM cluster (make cluster-up, state in build/slurm)
# and stops it in its last code block. If a block in between fails, stop it at the end of
# the session — only when this session started it.
SLURM_STATE = ROOT / "build" / "slurm"
SLURM_WAS_UP = (SLURM_STATE / "pid").exists()
# `make test` runs three pytest workers (pytest-xdist, --dist loadgroup); each group below
# runs whole, in order, on one worker. A test file is a group (its module fixtures run
# once). A page is a group (its blocks build on each other), except that the pages that
# use the course's SLURM cluster (one per machine: build/slurm) form one group with
# tests/cluster. Every other test has its own tmp_path and free ports; pages write under
# runs/ and logs/ in folders of their own (tests/docs/test_pages_share_nothing.py).
SHARED = "slurm-cluster"
# torchrun's default port (29500) is the one thing every `torchrun --nproc_per_node=N`
# line on the pages would share. PET_MASTER_PORT is torchrun's own environment form of
# --master-port: each worker gets one of its own, outside the OS's range for free ports
# (32768-60999) and away from the ports the pages name. The commands stay as shown.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if WORKER.startswith("gw"):
    os.environ["PET_MASTER_PORT"] = str(29600 + 100 * int(WORKER[2:]))
SESSION_FIXTURE = "lab1_run"  # the files that use it form one group: it runs once


@pytest.hookimpl(tryfirst=True)  # before xdist turns the groups into scheduling scopes
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    page_code: dict[Path, str] = {}  # the blocks of each page that run
    for item in items:
        block = getattr(item, "obj", None) if item.path.suffix == ".md" else None
        if block is not None and not any("skip(" in mark for mark in block.marks):
            page_code[item.path] = page_code.get(item.path, "") + block.code
    lab1_files = {i.path for i in items if SESSION_FIXTURE in getattr(i, "fixturenames", ())}
    for item in items:
        path = item.path.resolve().relative_to(ROOT)
        if item.path in lab1_files:
            group = SESSION_FIXTURE
        elif path.parts[:2] == ("tests", "cluster") or SLURM_COMMANDS.search(
            page_code.get(item.path, "")
        ):
            group = SHARED
        else:
            group = str(path)
        item.add_marker(pytest.mark.xdist_group(group))


def page_outputs(page: Path, code: str) -> list[Path]:
    """The folders and files under runs/ and logs/ that a page's blocks write: its own
    (tests/docs/test_pages_share_nothing.py checks no other page uses them)."""
    found: set[str] = set()
    for line in code.replace("\\\n", " ").splitlines():
        found |= places(line)
    paths = []
    for place in sorted(found - SHARED_ON_PURPOSE):
        if place.endswith("/rank_N"):  # a script's default log folder: logs/rank_0, ...
            paths += sorted((ROOT / place.removesuffix("/rank_N")).glob("rank_*"))
        elif place.endswith("-"):  # a name completed in the shell: runs/seed-$seed
            paths += sorted((ROOT / place).parent.glob(Path(place).name + "*"))
        else:
            paths.append(ROOT / place)
    return paths


CLEANED: set[Path] = set()  # pages whose outputs this worker removed


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before a page's first block: remove what a last run of the page left in runs/ and
    logs/, so that a second `make test` in the same checkout prints what the first did (a
    shard writer would say "0 written, 6 already complete", `--resume auto` would resume a
    finished run). A page runs whole on one worker (its xdist group), its blocks in order.
    The SLURM pages share their group and their folders: they clean up in their own blocks.
    """
    if not isinstance(item, TestBlock) or item.path in CLEANED:
        return
    CLEANED.add(item.path)
    blocks = [i for i in item.session.items if isinstance(i, TestBlock) and i.path == item.path]
    code = "".join(block.obj.code for block in blocks)  # every block of the page
    if SLURM_COMMANDS.search(code):
        return
    for path in page_outputs(item.path, code):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def block_failure(item: TestBlock, excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    """A failed page block's report as text: a failed command shows its exit code and output.

    pytest-codeblocks reports ``args[0]`` of the exception, which for a failed command is
    only its exit code (an int, which xdist cannot send back from a worker either).
    """
    err = excinfo.value
    if isinstance(err, subprocess.CalledProcessError):
        out = (err.stdout or b"").decode(errors="replace")[-3000:]
        tail = (err.stderr or b"").decode(errors="replace")[-3000:]
        return (
            f"{item.name}: the block exited with code {err.returncode}\n```\n{item.obj.code}```\n"
            f"stdout (end):\n{out}\nstderr (end):\n{tail}"
        )
    return str(err.args[0]) if err.args else repr(err)


TestBlock.repr_failure = block_failure  # type: ignore[method-assign]

_compare_exactly = TestBlock.runtest


def runtest_with_times_masked(self: TestBlock) -> None:
    """Run a command whose shown output has timestamps or speeds; compare the rest exactly."""
    block, expected = self.obj, self.obj.expected_output
    if block.syntax not in ("bash", "sh") or expected is None or masked(expected) == expected:
        return _compare_exactly(self)
    shell = "/bin/bash" if block.syntax == "bash" else None
    done = subprocess.run(block.code, shell=True, check=True, capture_output=True, executable=shell)
    got = done.stdout.decode()
    if masked(got) != masked(expected):
        raise RuntimeError(
            f"{self.name}, line {block.lineno}:\n```\nExpected output (times masked)\n```\n"
            f"{expected}```\nbut got\n```\n{got}```"
        )
    return None


TestBlock.runtest = runtest_with_times_masked  # type: ignore[method-assign]


UNIT_SECONDS: dict[str, float] = {}  # page or test file -> seconds, summed (suite_budget)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Every phase of every test, on the controller (xdist sends the workers' reports)."""
    UNIT_SECONDS[unit_of(report.nodeid)] = UNIT_SECONDS.get(unit_of(report.nodeid), 0.0) + (
        report.duration
    )


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The ten slowest pages and test files beside their budgets (tests/suite_budget.py),
    and, after a run of the whole suite (`pytest ... tests docs`), every unit's time in
    build/suite_times.json, which tools/suite_times.py records."""
    if hasattr(config, "workerinput") or not UNIT_SECONDS:
        return
    terminalreporter.section("slowest pages and test files (tests/suite_budget.py)")
    for line in slowest(UNIT_SECONDS):
        terminalreporter.write_line(line)
    for line in over_budget(UNIT_SECONDS):
        terminalreporter.write_line(f"over its budget in this run: {line}")
    times = json.dumps(dict(sorted(UNIT_SECONDS.items())), indent=1) + "\n"
    (ROOT / "build").mkdir(exist_ok=True)
    (ROOT / "build" / "suite_times_last.json").write_text(times)  # this run's, whole or not
    if {"tests", "docs"} <= {Path(a).as_posix().rstrip("/") for a in config.args}:  # a full run
        (ROOT / "build" / "suite_times.json").write_text(times)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller stops the cluster once every worker is done
    if not SLURM_WAS_UP and (SLURM_STATE / "pid").exists():
        subprocess.run(
            ["bash", str(ROOT / "tools" / "slurm" / "cluster.sh"), "down"],
            capture_output=True,
            timeout=120,
        )
