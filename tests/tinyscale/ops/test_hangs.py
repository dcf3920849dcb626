"""tinyscale.ops.hangs: each scenario ends (timeout or crash, never a hang), and the evidence
it leaves names the mismatch: the stacks say where each rank waits, the flight-recorder
analysis says which collective the ranks disagree on."""

import pickle
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.errors import UsageError, run_cli
from tinyscale.ops.hangs import (
    HangConfig,
    dump_record,
    findings,
    flight_recorder,
    main,
    run_scenario,
    short_error,
    where_waiting,
)


def test_short_error_keeps_the_gist() -> None:
    gloo = (
        "[/w/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation"
    )
    assert short_error(gloo) == "timed out after 3 s"
    closed = "[/w/pair.cc:598] Connection closed by peer [127.0.0.1]:41234"
    assert short_error(closed).startswith("connection closed by peer")
    assert short_error("[/a/b.cc:1] something else\nmore") == "something else"


STACKS = """Timeout (0:00:01.200000)!
Thread 0x00007f23367fc6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 1399 in run

Thread 0x00007f23fdbc7b80 (most recent call first):
  File "/x/torch/distributed/distributed_c10d.py", line 3913 in all_reduce
  File "/x/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/x/tinyscale/ops/hangs.py", line 44 in wrong_order
  File "/x/tinyscale/ops/hangs.py", line 128 in hang_worker
  File "/x/tinyscale/launch.py", line 83 in _worker
"""


def test_where_waiting_reads_the_main_thread_innermost_first() -> None:
    assert where_waiting(STACKS) == "all_reduce (distributed_c10d.py) < wrong_order (hangs.py)"
    assert where_waiting("") == ""  # a rank that died before its watchdog fired


def test_findings_keep_the_verdict_not_the_stack() -> None:
    lines = [
        "Collective sequence number: 2 has errors",
        "internal record id: 1",
        "collective: gloo:all_reduce",
        "error msg: Culprit rank 1; Error type: COLLECTIVE_TYPE_MISMATCH",
        " all_reduce at /x/distributed_c10d.py:3906",
    ]
    assert findings(lines) == [lines[0], lines[2], lines[3]]


def test_bad_input_is_one_line_naming_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError, match="use one of order, skip, shape, stuck, fixed"):
        HangConfig(scenario="deadlock")
    with pytest.raises(UsageError, match=r"0\.5 to 60"):
        HangConfig(scenario="order", timeout_s=0)
    assert run_cli(main, ["--scenario", "order", "--timeout-s", "600"]) == 2
    assert capsys.readouterr().err == "error: --timeout-s 600: use 0.5 to 60 seconds\n"


def test_gloo_dump_needs_the_pg_config_fix(tmp_path: Path) -> None:
    """The workaround in dump_record is needed in this torch: the raw dump files the group's
    configuration under '' while its entries say '0'. When torch fixes it, this test says so."""
    store = tempfile.mkdtemp(prefix="tinyscale-fr-")
    with flight_recorder():
        dist.init_process_group("gloo", init_method=f"file://{store}/s", rank=0, world_size=1)
    try:
        dist.all_reduce(torch.ones(2))
        raw = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
        dump_record(tmp_path, 0)
    finally:
        dist.destroy_process_group()
    names = {e["process_group"][0] for e in raw["entries"]}
    assert "" in raw["pg_config"] and not names & set(raw["pg_config"]), "torch fixed it?"
    fixed = pickle.loads((tmp_path / "rank_0").read_bytes())
    assert names <= set(fixed["pg_config"])


def timer_while_blocked() -> float:
    """Rank 0 blocks in a collective rank 1 never joins; when does a Python timer fire?"""
    start, fired = time.monotonic(), []
    timer = threading.Timer(0.3, lambda: fired.append(time.monotonic() - start))
    timer.start()
    if dist.get_rank() == 0:
        with pytest.raises(RuntimeError):  # the group's 3-second timeout
            dist.all_reduce(torch.ones(4))
    else:
        time.sleep(3.5)
    timer.join()
    return fired[0]


def test_a_python_timer_fires_while_a_rank_waits_in_a_collective() -> None:
    """torch releases the GIL while a rank waits: the watchdog thread runs on time."""
    fired = run_on_ranks(timer_while_blocked, 2, timeout_s=3.0, deadline_s=60)
    assert fired[0] < 1.5, f"the timer fired after {fired[0]:.1f} s: the wait holds the GIL"


@pytest.mark.timeout(120)
def test_wrong_order_is_found_and_named(tmp_path: Path) -> None:
    lines = run_scenario(HangConfig(scenario="order", trace_dir=tmp_path))
    text = "\n".join(lines)
    assert "rank 0 was in: all_reduce (distributed_c10d.py) < wrong_order" in text
    assert "rank 1 was in: broadcast (distributed_c10d.py) < wrong_order" in text
    assert "Collective sequence number: 2 has errors" in text  # 1 is the healthy all-reduce
    assert "Culprit rank 1; Error type: COLLECTIVE_TYPE_MISMATCH" in text
    assert "found collective type: 'broadcast'" in text
    ends = [line for line in lines if line.startswith(("rank 0: ", "rank 1: "))]
    assert len(ends) == 2 and all("finished" not in e for e in ends), ends  # both gave up


@pytest.mark.timeout(120)
def test_a_rank_stuck_in_io_is_the_missing_rank(tmp_path: Path) -> None:
    text = "\n".join(run_scenario(HangConfig(scenario="stuck", trace_dir=tmp_path)))
    assert "rank 1 was in: read_shard (hangs.py) < stuck_in_io" in text
    assert "rank 0 was in: all_reduce (distributed_c10d.py) < stuck_in_io" in text
    assert "Not all ranks joining collective, sequence number: 2" in text
    assert "missing ranks: {1}" in text


@pytest.mark.timeout(120)
def test_a_shape_mismatch_crashes_gloo_instead_of_hanging(tmp_path: Path) -> None:
    text = "\n".join(run_scenario(HangConfig(scenario="shape", trace_dir=tmp_path)))
    assert "a rank crashed: rank 0 exited with code -6" in text  # SIGABRT from gloo's check
    assert "no flight recorder analysis" in text
