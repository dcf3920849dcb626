"""tinyscale.comm.workers: cells run on every rank in persistent namespaces; errors come back
per rank in one line; a hung or mismatched collective closes the pool within its timeout;
close() leaves no process behind; and the Week 1 notebook runs top to bottom."""

import os
import re
import time
from pathlib import Path

import pytest

from tinyscale.comm.workers import GRACE_S, CellError, WorkerPool, register_magic
from tinyscale.core.errors import UsageError

NOTEBOOK = Path(__file__).resolve().parents[3] / "docs" / "week-1" / "notebook.ipynb"
TIMEOUT_S = 2.0  # short collective timeout, so the failure tests stay quick
# Closing a broken pool: GRACE_S for goodbyes, then terminate (5 s at most); slack for load.
CLOSE_SLACK_S = 10.0


def gone(pid: int) -> bool:
    """The process no longer exists (or is no longer one of our spawn workers)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return True
    return b"multiprocessing" not in cmdline  # the pid was reused by something else


def test_cells_share_a_namespace_per_rank_and_errors_come_back(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pool = WorkerPool(3, timeout_s=10)
    pids = pool.pids
    try:
        assert len(set(pids)) == 3 and os.getpid() not in pids
        assert pool.run("print(rank, world_size)") == ["0 3\n", "1 3\n", "2 3\n"]
        # Names persist; a bare last expression is printed, as in Jupyter.
        pool.run("t = torch.tensor([rank + 1.0])\ndist.all_reduce(t)")
        assert pool.run("t * 2") == ["tensor([12.])\n"] * 3
        assert pool.run("x = 5") == [""] * 3  # an assignment prints nothing
        # One rank raises: its one-line error, the others' output, and the pool lives on.
        with pytest.raises(CellError) as err:
            pool.run("print('before')\ny = 1 / (rank - 1)")
        assert str(err.value) == "rank 1 of 3 raised ZeroDivisionError: division by zero"
        assert err.value.outputs[0] == "before\n"
        assert err.value.outputs[1] == "before\nZeroDivisionError: division by zero\n"
        assert err.value._render_traceback_() == [f"CellError: {err.value}"]
        with pytest.raises(CellError, match="rank 0 of 3 raised SyntaxError"):
            pool.run("def (")
        assert not pool.closed
        pool.print("print(f'hello\\nfrom {rank}')")
        assert capsys.readouterr().out.splitlines() == [
            "[rank 0] hello",
            "[rank 0] from 0",
            "[rank 1] hello",
            "[rank 1] from 1",
            "[rank 2] hello",
            "[rank 2] from 2",
        ]
        with pytest.raises(UsageError, match="needs IPython"):
            register_magic(pool)  # no IPython shell in pytest
    finally:
        pool.close()
    assert pool.closed and pool.pids == []
    assert all(gone(pid) for pid in pids)
    pool.close()  # twice is fine
    with pytest.raises(UsageError, match="start a new one"):
        pool.run("print(rank)")


BROKEN_CELLS = {
    "skipped collective": (
        "if rank == 0:\n    dist.all_reduce(torch.ones(1))",
        r"ranks \[0\] failed in a collective \(timed out after 2 s",
    ),
    "stuck in python": ("import time\nif rank == 1:\n    time.sleep(60)", r"ranks \[1\] gave no"),
    "dead worker": ("import os\nif rank == 1:\n    os._exit(3)", r"ranks \[1\] gave no answer"),
}


@pytest.mark.parametrize("case", list(BROKEN_CELLS))
def test_a_broken_cell_fails_in_one_line_and_closes_the_pool(case: str) -> None:
    code, expected = BROKEN_CELLS[case]
    with WorkerPool(2, timeout_s=TIMEOUT_S) as pool:
        pids = pool.pids
        start = time.monotonic()
        with pytest.raises(CellError) as err:
            pool.run(code)
        elapsed = time.monotonic() - start
        message = str(err.value)
        assert re.match(expected, message), message
        assert "\n" not in message and message.endswith("start a new WorkerPool")
        assert pool.closed and pool.pids == []
        assert all(gone(pid) for pid in pids)
        assert elapsed < TIMEOUT_S + GRACE_S + CLOSE_SLACK_S


@pytest.mark.parametrize(
    "kwargs,fix", [(dict(world_size=0), "at least 1"), (dict(timeout_s=0), "positive")]
)
def test_bad_arguments_start_nothing(kwargs: dict, fix: str) -> None:
    with pytest.raises(UsageError, match=fix):
        WorkerPool(**kwargs)


def test_the_week1_notebook_runs_and_leaves_no_process() -> None:
    """The page's notebook, executed as the site build executes it (nbclient)."""
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # Record the workers' pids right after the pool starts, to check they are gone.
    start = next(
        i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "WorkerPool(4" in c.source
    )
    nb.cells.insert(start + 1, nbformat.v4.new_code_cell("print('PIDS', *pool.pids)"))
    nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": NOTEBOOK.parent}}
    ).execute()  # raises CellExecutionError on any error not tagged raises-exception
    text = {
        c.source: "".join(o.get("text", "") + "\n".join(o.get("traceback", [])) for o in c.outputs)
        for c in nb.cells
        if c.cell_type == "code"
    }
    joined = "\n".join(text.values())
    pids = [int(p) for p in re.search(r"PIDS((?: \d+)+)", joined).group(1).split()]
    assert len(pids) == 4
    assert "[rank 3] I am rank 3 of 4 (gloo)" in joined
    assert "[rank 2] tensor([60., 64., 68.])" in joined  # 0 + 10 + 20 + 30 = 60
    assert "[rank 0] the token came home with value 4" in joined
    assert "[rank 3] got 3 from rank 2, pass 4 on" in joined
    assert "[rank 0] sent 0 right, got 3 from the left" in joined
    assert "[rank 3] tensor([3., 1., 4.])" in joined
    assert "[rank 3] finished the cell" in joined
    assert "CellError: ranks [0, 1, 2] failed in a collective" in joined
    assert "closed: True, workers left: []" in joined
    assert all(gone(pid) for pid in pids)
