"""`make test`'s workers keep a group together (pytest-xdist's --dist loadgroup).

conftest.py marks what must run on one worker, in order: a page's blocks, a test file,
the pages that share the SLURM cluster. If the grouping
silently stops working (it did with pytest 9 and pytest-xdist 3.8), pages fail at
random; this test fails first, with the reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = """
import os
import pytest

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    with open(os.path.join(os.environ["GROUP_OUT"], f"worker_{i}"), "w") as out:
        out.write(os.environ["PYTEST_XDIST_WORKER"])
"""


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(TESTS)
    cmd = [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q", "-p",
           "no:cacheprovider", "test_grouped.py"]  # fmt: skip
    env = {**os.environ, "GROUP_OUT": str(tmp_path)}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    workers = {p.read_text() for p in tmp_path.glob("worker_*")}
    assert len(list(tmp_path.glob("worker_*"))) == 6
    assert len(workers) == 1, f"one group ran on {sorted(workers)}: pin pytest<9 (pyproject)"
