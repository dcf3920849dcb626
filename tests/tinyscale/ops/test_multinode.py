"""tinyscale.ops.multinode: rank arithmetic, checks before the rendezvous, the worker entry point,
and real barriers timed on real processes (run_on_ranks, gloo).

Timing assertions are bounds only: a barrier cannot release a rank before the last one has
arrived (a causal fact, on one machine's clock), and every wait is bounded above generously.
"""

import json
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from helpers import ROOT
from tinyscale.comm.launch import free_port, run_on_ranks
from tinyscale.core.errors import UsageError
from tinyscale.ops.multinode import (
    NEVER,
    barrier_report,
    check_layout,
    check_port_free,
    env_line,
    expected_env,
    locate_rank,
    node_rank_range,
    parse_env_line,
    timed_barrier,
    wait_reachable,
)

# Ranks are lined up by a first barrier, whose release reaches each rank a few ms apart.
START_SKEW_S = 0.05
# Upper bound on any wait beyond what the delays explain: scheduling on 2 shared cores.
SLACK_S = 5.0
LAB3 = ROOT / "docs" / "generated" / "lab3"


# --- rank arithmetic ------------------------------------------------------------------------
def test_node_3_of_4_with_4_processes_owns_ranks_12_to_15() -> None:
    assert list(node_rank_range(3, 4)) == [12, 13, 14, 15]
    assert list(node_rank_range(2, 4)) == [8, 9, 10, 11]  # "the third node", counted from 1


@pytest.mark.parametrize(("nnodes", "nproc"), [(1, 1), (2, 2), (4, 4), (3, 8)])
def test_nodes_split_the_world_into_consecutive_blocks(nnodes: int, nproc: int) -> None:
    ranks = [r for node in range(nnodes) for r in node_rank_range(node, nproc)]
    assert ranks == list(range(nnodes * nproc))
    for rank in ranks:
        node, local = locate_rank(rank, nproc)
        assert rank in node_rank_range(node, nproc) and 0 <= local < nproc
        assert node * nproc + local == rank


def test_expected_env_is_what_torchrun_sets() -> None:
    table = expected_env(2, 2, "127.0.0.1", 29500)
    assert [e["RANK"] for e in table] == ["0", "1", "2", "3"]
    assert [(e["NODE_RANK"], e["LOCAL_RANK"]) for e in table] == [
        ("0", "0"), ("0", "1"), ("1", "0"), ("1", "1"),
    ]  # fmt: skip
    assert all(e["GROUP_RANK"] == e["NODE_RANK"] and e["WORLD_SIZE"] == "4" for e in table)


# --- checks ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("nnodes", "nproc", "node_rank", "says"),
    [
        (2, 1, 2, "NODE_RANK 2 does not fit NNODES 2: node ranks are 0..1"),
        (2, 1, -1, "NODE_RANK -1 does not fit NNODES 2"),
        (4, 4, 4, "node ranks are 0..3, counted from 0"),
        (0, 1, None, "--nnodes 0 --nproc-per-node 1: both must be at least 1"),
        (2, 0, 0, "--nnodes 2 --nproc-per-node 0"),
    ],
)
def test_layouts_that_disagree_are_one_line_errors(
    nnodes: int, nproc: int, node_rank: int | None, says: str
) -> None:
    with pytest.raises(UsageError, match=says) as err:
        check_layout(nnodes, nproc, node_rank)
    assert "\n" not in str(err.value)


def test_good_layouts_pass() -> None:
    check_layout(1, 1)
    check_layout(4, 4, 3)
    check_layout(2, 8, 0)


def test_port_in_use_not_local_or_not_a_port_is_refused() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(UsageError, match=re.escape(f"127.0.0.1:{port}: in use")):
            check_port_free("127.0.0.1", port)
    with pytest.raises(UsageError, match=re.escape("192.0.2.1:29500: not an address of ours")):
        check_port_free("192.0.2.1", 29500)  # TEST-NET-1: never an address of ours
    for bad in (0, 70000):
        with pytest.raises(UsageError, match="is not a TCP port"):
            check_port_free("127.0.0.1", bad)
    check_port_free("127.0.0.1", free_port())  # and a free one passes


def test_nobody_listening_is_an_error_after_the_timeout_not_before() -> None:
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(
        UsageError, match=f"nobody answers at MASTER_ADDR:MASTER_PORT 127.0.0.1:{port} after 1 s"
    ):
        wait_reachable("127.0.0.1", port, timeout_s=1.0)
    assert 1.0 <= time.monotonic() - t0 < 1.0 + SLACK_S


def test_a_node_0_that_comes_late_is_waited_for() -> None:
    """Connection refused means "not up yet": keep trying until the deadline."""
    port = free_port()
    server = socket.socket()

    def listen_later() -> None:
        time.sleep(1.0)
        server.bind(("127.0.0.1", port))
        server.listen()

    thread = threading.Thread(target=listen_later)
    thread.start()
    try:
        t0 = time.monotonic()
        wait_reachable("127.0.0.1", port, timeout_s=10.0)
        assert 1.0 <= time.monotonic() - t0 < 10.0
    finally:
        thread.join()
        server.close()


# --- the worker entry point -----------------------------------------------------------------
def test_env_line_round_trips_and_marks_missing_variables() -> None:
    env = expected_env(2, 2, "127.0.0.1", 29500)[3]
    line = env_line(env)
    assert line.startswith("whoami | NODE_RANK=1 GROUP_RANK=1 LOCAL_RANK=1 RANK=3 WORLD_SIZE=4")
    assert parse_env_line(line) == env
    assert parse_env_line("a log line") is None
    assert parse_env_line(env_line({})) == dict.fromkeys(env, "-")


def test_python_m_tinyscale_multinode_prints_then_runs_the_script_as_main(tmp_path) -> None:
    script = tmp_path / "show.py"
    script.write_text("import sys\nif __name__ == '__main__':\n    print('argv', sys.argv[1:])\n")
    env = {"PATH": "/usr/bin:/bin", "RANK": "5", "WORLD_SIZE": "8", "GROUP_RANK": "2"}
    done = subprocess.run(
        [sys.executable, "-m", "tinyscale.ops.multinode", str(script), "--max-steps", "3"],
        capture_output=True, text=True, timeout=60, env=env, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert parse_env_line(first) == {
        "NODE_RANK": "-", "GROUP_RANK": "2", "LOCAL_RANK": "-", "RANK": "5", "WORLD_SIZE": "8",
        "MASTER_ADDR": "-", "MASTER_PORT": "-",
    }  # fmt: skip
    assert second == "argv ['--max-steps', '3']"


# --- barriers -------------------------------------------------------------------------------
def test_a_barrier_releases_everyone_when_the_last_rank_arrives() -> None:
    delays = [0.0, 0.5, 1.5]
    results = run_on_ranks(timed_barrier, 3, delays, timeout_s=30)
    last_arrival = max(r["arrived"] for r in results)
    for r, delay in zip(results, delays, strict=True):
        assert r["error"] is None
        assert r["arrived"] - r["start"] >= delay  # it did its "work" first
        assert r["released"] >= last_arrival  # nobody leaves before the last one came
        assert r["released"] - last_arrival < SLACK_S
    early, late = results[0], results[2]
    waited = early["released"] - early["arrived"]
    assert delays[2] - START_SKEW_S <= waited < delays[2] + SLACK_S
    assert late["released"] - late["arrived"] < SLACK_S
    lines = barrier_report(results)
    assert len(lines) == 3
    # rank 0 arrives at once (0.00 s, or 0.0x s on a loaded machine); the times are checked above
    assert re.fullmatch(
        r"rank 0: arrived +0\.0\d s \| released +\d+\.\d\d s \| waited +\d+\.\d\d s", lines[0]
    )


def test_a_rank_that_never_comes_times_out_the_barrier_of_the_others() -> None:
    timeout = 2.0
    results = run_on_ranks(timed_barrier, 2, [0.0, NEVER], False, timeout, timeout_s=timeout)
    waiting, absent = results
    assert absent["arrived"] is None
    assert (
        waiting["error"]
        == f"Timed out waiting {timeout * 1000:.0f}ms for recv operation to complete"
    )
    assert timeout <= waiting["released"] - waiting["arrived"] < timeout + SLACK_S
    assert barrier_report(results)[1] == "rank 1: never arrived"


def test_monitored_barrier_names_the_rank_that_did_not_come() -> None:
    timeout = 2.0
    results = run_on_ranks(timed_barrier, 3, [0.0, 0.0, NEVER], True, timeout, timeout_s=30)
    assert results[0]["error"] == "[Rank 0]: Rank 2 failed to pass monitoredBarrier in 2000 ms"
    assert "Rank 1 successfully reached monitoredBarrier" in results[1]["error"]
    for r in results[:2]:
        assert timeout - START_SKEW_S <= r["released"] - r["arrived"] < timeout + SLACK_S


# --- the recorded outputs of tools/figures_lab3.py barrier ---------------------------------
def test_recorded_barrier_timings_are_consistent() -> None:
    rows = json.loads((LAB3 / "barrier.json").read_text())
    last = max(r["arrived"] for r in rows)
    for r in rows:
        assert r["arrived"] >= r["delay"] and r["released"] >= last
    table = (LAB3 / "barrier.md").read_text().splitlines()[2:]
    for r, line in zip(rows, table, strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert float(cells[4]) == round(r["released"] - r["arrived"], 3)
    text = (LAB3 / "barrier_timeout.txt").read_text()
    assert "Timed out waiting 3000ms for recv operation to complete" in text
    assert "Rank 2 failed to pass monitoredBarrier in 3000 ms" in text
