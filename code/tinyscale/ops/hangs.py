# --8<-- [start:header]
"""Distributed hangs, reproduced on CPU: wrong order, a skipped collective, a shape mismatch,
a rank stuck in I/O. Each ends in a timeout (or a crash), never in a hang, and leaves evidence.

Launch:  python -m tinyscale.ops.hangs --scenario order

Every scenario runs on 2 gloo processes with a short collective timeout. A watchdog thread
on every rank fires before that timeout, while every rank still waits, and writes two
files per rank: the Python stack of every thread (``faulthandler``) and the *flight
recorder* (the process group's ring buffer of the last collectives it was asked to run,
``TORCH_FR_BUFFER_SIZE``). Torch's analyzer (``python -m
torch.distributed.flight_recorder.fr_trace DIR``) then lines the ranks' records up and
names the first collective on which they disagree.
"""

import contextlib
import dataclasses
import faulthandler
import io
import logging
import os
import pickle
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tinyscale.comm.launch import RankFailed, run_on_ranks
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli

# --8<-- [end:header]


# --8<-- [start:scenarios]
def wrong_order(rank: int, timeout_s: float) -> None:
    """Rank 0 all-reduces, then broadcasts; rank 1 makes the same two calls in the other order."""
    grads, flag = torch.ones(4), torch.zeros(1)
    if rank == 0:
        dist.all_reduce(grads)
        dist.broadcast(flag, src=0)
    else:
        dist.broadcast(flag, src=0)  # e.g. an "early stop?" broadcast placed before the sync
        dist.all_reduce(grads)


def uneven_batches(rank: int, timeout_s: float) -> None:
    """Rank 1's shard has one batch fewer: it leaves the loop and waits at the barrier.

    Data-dependent control flow: the number of collectives depends on the data, so the
    ranks disagree on what the next collective is.
    """
    batches = 3 if rank == 0 else 2
    for _ in range(batches):
        dist.all_reduce(torch.ones(4))  # one gradient sync per batch
    dist.barrier()


def wrong_shape(rank: int, timeout_s: float) -> None:
    """Both ranks all-reduce, but rank 0's tensor has 4 elements and rank 1's has 8."""
    dist.all_reduce(torch.ones(4 if rank == 0 else 8))


def read_shard(seconds: float) -> None:
    time.sleep(seconds)  # stands for a read from an overloaded NFS server


def stuck_in_io(rank: int, timeout_s: float) -> None:
    """Rank 1 reads from slow storage for longer than the timeout; rank 0 waits in the all-reduce."""
    if rank == 1:
        read_shard(timeout_s + 1)
    dist.all_reduce(torch.ones(4))


# --8<-- [end:scenarios]


# --8<-- [start:fix]
def agreed_batches(local_batches: int) -> int:
    """The fix for `skip`: every rank runs as many batches as the rank with the fewest."""
    count = torch.tensor([local_batches])
    dist.all_reduce(count, op=dist.ReduceOp.MIN)  # one collective that every rank calls
    return int(count.item())


def even_batches(rank: int, timeout_s: float) -> None:
    """Same shards as `skip`, but the ranks agree on the number of batches first."""
    for _ in range(agreed_batches(3 if rank == 0 else 2)):
        dist.all_reduce(torch.ones(4))
    dist.barrier()


# --8<-- [end:fix]


# --8<-- [start:registry]
SCENARIOS: dict[str, Callable[[int, float], None]] = {
    "order": wrong_order,
    "skip": uneven_batches,
    "shape": wrong_shape,
    "stuck": stuck_in_io,
    "fixed": even_batches,
}
# --8<-- [end:registry]


# --8<-- [start:dump]
def dump_record(trace_dir: Path, rank: int) -> None:
    """Write this rank's flight-recorder record, as torch's analyzer reads it.

    Torch 2.14.1's gloo group files its configuration under the name '' while its entries
    name the group '0'; the analyzer looks the group up by the entries' name and stops with
    ``KeyError: ('0', 0)``. We file the configuration under the name the entries use.
    """
    record = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
    config = record["pg_config"]
    if "" in config:
        unnamed = config.pop("")
        for name in {entry["process_group"][0] for entry in record["entries"]}:
            config[name] = {**unnamed, "name": name}
    trace_dir.mkdir(parents=True, exist_ok=True)
    (trace_dir / f"rank_{rank}").write_bytes(pickle.dumps(record))


# --8<-- [end:dump]


# --8<-- [start:worker]
def hang_worker(scenario: str, trace_dir: str, timeout_s: float) -> dict[str, Any]:
    """Run one scenario on this rank under a watchdog that fires at 60 % of the timeout.

    The watchdog is a Python timer thread. It runs on time although the main thread is
    blocked in a collective: torch releases the GIL while a rank waits (gloo and NCCL
    alike). It writes every thread's stack, then the flight recorder, one after the other
    and holding the GIL, so no other Python code runs while it reads the stacks.
    (NCCL's own watchdog, a C++ thread, dumps the record on timeout by itself:
    TORCH_NCCL_DUMP_ON_TIMEOUT.)
    """
    rank, out = dist.get_rank(), Path(trace_dir)
    dist.all_reduce(torch.ones(1))  # one healthy collective: the record starts in agreement
    out.mkdir(parents=True, exist_ok=True)
    finished = threading.Event()

    def watchdog() -> None:
        if not finished.is_set():  # still waiting: where?
            with open(out / f"stacks_{rank}.txt", "w") as stacks:
                faulthandler.dump_traceback(file=stacks, all_threads=True)
        dump_record(out, rank)

    timer = threading.Timer(0.6 * timeout_s, watchdog)
    timer.start()
    start, error = time.monotonic(), None
    try:
        SCENARIOS[scenario](rank, timeout_s)
    except RuntimeError as err:
        error = short_error(str(err))
    finished.set()  # finished in time: no stacks to show
    timer.join()  # the record is on disk before this rank reports
    return {"rank": rank, "error": error, "seconds": time.monotonic() - start}


def short_error(message: str) -> str:
    """The gist of a gloo error, without source paths and port numbers."""
    if m := re.search(r"Timed out waiting (\d+)ms", message):
        return f"timed out after {int(m[1]) / 1000:g} s"
    if "Connection closed by peer" in message:
        return "connection closed by peer: the other rank gave up first"
    return re.sub(r"\[\S+:\d+\] ", "", message.strip().splitlines()[0])[:120]


# --8<-- [end:worker]


# --8<-- [start:analyze]
def analyze(trace_dir: Path) -> list[str]:
    """Torch's flight-recorder analyzer on the dumps, its report captured as lines."""
    buffer = io.StringIO()
    with contextlib.redirect_stderr(buffer):  # its import warns that `tabulate` is missing
        from torch.distributed.flight_recorder.fr_trace import main as fr_trace
    log = logging.getLogger("Flight Recorder")  # where fr_trace writes its findings
    saved, log.handlers = log.handlers, [logging.StreamHandler(buffer)]
    try:
        fr_trace([str(trace_dir), "--prefix", "rank_"])
    finally:
        log.handlers = saved
    return buffer.getvalue().splitlines()


def findings(lines: Sequence[str]) -> list[str]:
    """The analyzer's verdict without its stack dump: sequence number, op, ranks, the error."""
    keep = ("Collective sequence", "Not all ranks", "collective:", "missing ranks", "error msg")
    return [line.strip() for line in lines if line.strip().startswith(keep)]


def where_waiting(stacks: str) -> str:
    """The main thread's frames, innermost first, down to the worker: where this rank waits."""
    for block in stacks.split("\n\n"):
        frames = re.findall(r'File "([^"]+)", line \d+ in (\S+)', block)
        funcs = [func for _, func in frames]
        if "hang_worker" not in funcs:
            continue  # another thread: the watchdog
        inner = frames[: funcs.index("hang_worker")]
        # torch wraps every collective in a logging decorator called `wrapper`: skip it
        return " < ".join(
            f"{func} ({Path(path).name})" for path, func in inner if func != "wrapper"
        )
    return ""  # no stack: the rank died before its watchdog fired


# --8<-- [end:analyze]


# --8<-- [start:run]
@dataclasses.dataclass(frozen=True, kw_only=True)
class HangConfig:
    scenario: str
    timeout_s: float = 2.0  # the process group's timeout: every collective waits at most this
    trace_dir: Path = Path("runs/hangs")
    world_size: int = 2

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise UsageError(
                f"unknown scenario {self.scenario!r}: use one of {', '.join(SCENARIOS)}"
            )
        if not 0.5 <= self.timeout_s <= 60:
            raise UsageError(f"--timeout-s {self.timeout_s:g}: use 0.5 to 60 seconds")


@contextlib.contextmanager
def flight_recorder(entries: int = 2000) -> Iterator[None]:
    """Switch the recorder on for process groups created inside (spawned ranks inherit it)."""
    saved = os.environ.get("TORCH_FR_BUFFER_SIZE")
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(entries)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TORCH_FR_BUFFER_SIZE")
        else:
            os.environ["TORCH_FR_BUFFER_SIZE"] = saved


def run_scenario(cfg: HangConfig) -> list[str]:
    """Run it, then report: how each rank ended, where it waited, what the analyzer found."""
    trace_dir = cfg.trace_dir / cfg.scenario
    for old in trace_dir.glob("*_*"):
        old.unlink()  # dumps of an earlier run would mix with this one's
    lines = [f"scenario {cfg.scenario}: {SCENARIOS[cfg.scenario].__doc__.splitlines()[0]}"]
    with flight_recorder():
        try:
            ranks = run_on_ranks(
                hang_worker, cfg.world_size, cfg.scenario, str(trace_dir), cfg.timeout_s,
                timeout_s=cfg.timeout_s, deadline_s=cfg.timeout_s + 60,
            )  # fmt: skip
        except RankFailed as err:
            lines.append(f"a rank crashed: {str(err).splitlines()[0]}")
            ranks = []
    for r in ranks:
        lines.append(f"rank {r['rank']}: {r['error'] or 'finished'}")
    for path in sorted(trace_dir.glob("stacks_*.txt")):
        if where := where_waiting(path.read_text()):
            lines.append(f"rank {path.stem.split('_')[1]} was in: {where}")
    if len(list(trace_dir.glob("rank_*"))) == cfg.world_size:
        found = findings(analyze(trace_dir)) or ["no mismatch: every rank ran the same collectives"]
        lines += ["flight recorder analysis:", *(f"  {f}" for f in found)]
    else:
        lines.append("no flight recorder analysis: a rank died before it could write its record")
    return lines


# --8<-- [end:run]


# --8<-- [start:main]
def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", required=True, help=", ".join(SCENARIOS))
    parser.add_argument("--timeout-s", type=float, default=HangConfig.timeout_s)
    parser.add_argument("--trace-dir", type=Path, default=HangConfig.trace_dir)
    args = parser.parse_args(argv)
    cfg = HangConfig(scenario=args.scenario, timeout_s=args.timeout_s, trace_dir=args.trace_dir)
    for line in run_scenario(cfg):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
# --8<-- [end:main]
