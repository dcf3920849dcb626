"""tinyscale.comm.launch: results come back by rank; a raising, dying or hanging rank fails fast
and is named; nothing is left running."""

import os
import sys
import time

import pytest
import torch
import torch.distributed as dist

from tinyscale.comm.launch import RankFailed, free_port, run_on_ranks, whoami
from tinyscale.core.errors import UsageError


def rank_and_tensor(scale: float) -> tuple[int, int, torch.Tensor, int]:
    rank = dist.get_rank()
    t = torch.full((3,), float(rank) * scale)
    dist.all_reduce(t)
    return rank, dist.get_world_size(), t, os.getpid()


def raise_on_rank_1() -> None:
    if dist.get_rank() == 1:
        raise ValueError("boom on purpose")
    dist.barrier()


def die_on_rank_2() -> None:
    if dist.get_rank() == 2:
        os._exit(3)
    dist.barrier()


def rank_1_skips_the_collective() -> None:
    if dist.get_rank() == 1:
        time.sleep(120)  # alive, but never calls the all-reduce rank 0 waits in
    else:
        dist.all_reduce(torch.ones(1))


def rank_0_sleeps() -> None:
    if dist.get_rank() == 0:
        time.sleep(60)


@pytest.mark.parametrize("world", [1, 3])
def test_results_come_back_in_rank_order(world: int) -> None:
    results = run_on_ranks(rank_and_tensor, world, 2.0)
    assert [r[0] for r in results] == list(range(world))
    assert all(r[1] == world for r in results)
    expected = 2.0 * sum(range(world))
    for _, _, tensor, _ in results:
        torch.testing.assert_close(tensor, torch.full((3,), expected))
    assert len({r[3] for r in results}) == world  # one process per rank
    assert all(r[3] != os.getpid() for r in results)


def test_a_raising_rank_is_named_with_its_traceback() -> None:
    with pytest.raises(RankFailed) as err:
        run_on_ranks(raise_on_rank_1, 2)
    assert str(err.value).startswith("rank 1 of 2 raised:")
    assert "ValueError: boom on purpose" in str(err.value)


def test_a_dead_rank_is_reported_not_waited_for() -> None:
    start = time.monotonic()
    with pytest.raises(RankFailed) as err:
        run_on_ranks(die_on_rank_2, 3, timeout_s=20)
    assert str(err.value).startswith("rank 2 exited with code 3 before returning a result")
    assert time.monotonic() - start < 60  # not a timing: proof that nothing waited forever


def test_a_skipped_collective_ends_in_the_process_group_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(RankFailed, match="rank 0 of 2 raised") as err:
        run_on_ranks(rank_1_skips_the_collective, 2, timeout_s=3)
    assert "timed out waiting 3000ms" in str(err.value).lower()  # timeout_s, not the join's
    assert time.monotonic() - start < 60  # rank 1 sleeps 120 s: it was not awaited


def test_the_deadline_bounds_the_whole_run() -> None:
    # 25 s: rank 1 must start, import torch and report in time even on a loaded 2-core
    # machine (8 s was too short beside the suite's other worker: both ranks were named).
    start = time.monotonic()
    with pytest.raises(RankFailed, match=r"ranks \[0\] gave no result within 25 s"):
        run_on_ranks(rank_0_sleeps, 2, deadline_s=25)
    assert time.monotonic() - start < 55  # rank 0 sleeps 60 s: it was not awaited


def test_whoami_reports_the_backend_and_a_collective() -> None:
    lines = run_on_ranks(whoami, 2)
    assert lines == [
        "rank 0 of 2 on gloo: sum of ranks = 1",
        "rank 1 of 2 on gloo: sum of ranks = 1",
    ]


def test_world_size_zero_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="world_size must be at least 1"):
        run_on_ranks(whoami, 0)


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def environment() -> tuple[str | None, str | None]:
    return os.environ.get("TINYSCALE_PROBE"), os.environ.get("TINYSCALE_CACHE")


def test_ranks_see_the_callers_environment_as_it_is_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork-server rank starts from the server's environment, frozen at its first use;
    run_on_ranks hands each rank the caller's current one, as spawn would. TINYSCALE_CACHE
    was set when tests/conftest.py was imported, before any server started."""
    run_on_ranks(whoami, 1)  # the fork server exists from here on
    assert os.environ.get("TINYSCALE_CACHE")
    monkeypatch.setenv("TINYSCALE_PROBE", "set later")
    monkeypatch.delenv("TINYSCALE_CACHE")
    assert run_on_ranks(environment, 2) == [("set later", None)] * 2


def parent() -> tuple[int, bytes]:
    ppid = os.getppid()
    with open(f"/proc/{ppid}/cmdline", "rb") as cmdline:
        return ppid, cmdline.read()


@pytest.mark.skipif(sys.platform != "linux", reason="spawn is the start method off Linux")
def test_ranks_are_forked_by_one_fork_server_not_by_the_caller() -> None:
    first, second = run_on_ranks(parent, 2), run_on_ranks(parent, 1)
    pids = {pid for pid, _ in first + second}
    assert len(pids) == 1 and os.getpid() not in pids  # one server, reused across calls
    assert b"forkserver" in first[0][1]
