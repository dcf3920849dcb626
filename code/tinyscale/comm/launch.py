# --8<-- [start:header]
"""Run one function on N local processes joined in a process group: torchrun in a function.

    python -c "from tinyscale.comm.launch import demo; demo()"

torchrun starts N copies of a *script*. The from-scratch lessons need something
smaller: call a *function* on every rank, get each rank's return value back, and fail
fast — never hang — when one rank raises, dies or waits forever. ``run_on_ranks`` does
that with nothing but ``multiprocessing`` and ``dist.init_process_group``; the tests,
the benchmarks and the lessons' code blocks all use it.
"""

import gc
import os
import pickle
import queue
import socket
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tinyscale.core.errors import UsageError

# --8<-- [end:header]


# --8<-- [start:port]
def free_port() -> int:
    """A TCP port nobody listens on right now: the OS picks it when we bind to port 0."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --8<-- [end:port]


# --8<-- [start:context]
# What every rank imports anyway: the fork server loads it once, and each rank is a copy.
# torch._dynamo too: torch.optim's optimizers, DDP and DCP import it on first use (seconds).
PRELOAD = ["torch", "torch.distributed", "torch._dynamo"]


def process_context() -> Any:
    """How ranks start: copies of a fork server on Linux, fresh interpreters elsewhere.

    A spawned rank is a new interpreter that imports torch again, seconds of CPU per rank
    on every call. A fork server is one clean interpreter, started with the first call,
    that imports torch and then forks a copy for each rank it is asked for: ranks start
    with torch already loaded. Each copy comes from the server, never from
    the caller, so it inherits no threads, no process group and no open sockets: none of
    plain fork's hazards. macOS and Windows keep spawn (forking a process that loaded
    Apple's system frameworks is not safe).
    """
    if sys.platform != "linux":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # ignored once the server runs: it loaded them
    return ctx


def adopt_environment(environ: dict[str, str]) -> None:
    """Give a rank its caller's environment as it is now, as spawn would.

    A fork-server copy inherits the *server's* environment, frozen when it started.
    """
    os.environ.clear()
    os.environ.update(environ)


# --8<-- [end:context]


# --8<-- [start:worker]
class RankFailed(RuntimeError):
    """A rank raised, died, or missed the deadline; the message names the rank."""


JOIN_TIMEOUT_S = 60.0  # how long a started rank waits for the others to start


def _worker(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    timeout_s: float,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
    started: Any,
    environ: dict[str, str],
) -> None:
    adopt_environment(environ)
    # The same variables torchrun sets, so code written for torchrun runs unchanged.
    os.environ |= {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    torch.set_num_threads(1)  # N processes share the cores; oversubscribing slows everyone
    try:
        # Start together: on a loaded machine one rank may start seconds after another,
        # longer than a short timeout lets init_process_group wait for it.
        started.wait(timeout=JOIN_TIMEOUT_S)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),  # bounds every collective: no silent hang
        )
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
        return
    try:
        # Plain pickle copies tensors by value; the multiprocessing pickler would pass
        # shared-memory handles that die with this process.
        report = (rank, True, pickle.dumps(fn(*args)))
    except BaseException:
        report = (rank, False, traceback.format_exc())
    results.put(report)  # before leaving the group, so the root cause is reported first
    gc.collect()  # free fn's leftovers (DDP hooks form cycles) now, not at interpreter exit
    dist.destroy_process_group()


# --8<-- [end:worker]


# --8<-- [start:run_on_ranks]
def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout_s: float = 30.0,
    deadline_s: float = 120.0,
) -> list[Any]:
    """Call ``fn(*args)`` on ``world_size`` fresh processes; return their results by rank.

    ``fn`` must be importable (defined at module level): it reaches the workers pickled.
    ``timeout_s`` bounds each collective inside ``fn``; ``deadline_s`` bounds the whole run.
    """
    if world_size < 1:
        raise UsageError(f"world_size must be at least 1, got {world_size}: use 1, 2, 4 ...")
    ctx = process_context()
    results, started = ctx.Queue(), ctx.Barrier(world_size)
    port, env = free_port(), dict(os.environ)
    procs = [
        ctx.Process(
            target=_worker,
            args=(rank, world_size, port, backend, timeout_s, fn, args, results, started, env),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    done: dict[int, Any] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + deadline_s
    try:
        while len(done) + len(errors) < world_size:
            try:
                rank, ok, payload = results.get(timeout=0.2)
            except queue.Empty:
                if _dead(procs, done) or (errors and time.monotonic() > deadline):
                    break  # a rank failed: report it now, do not wait for the rest
                if not errors:
                    _check_deadline(procs, done, deadline, deadline_s)
                continue
            if ok:
                done[rank] = pickle.loads(payload)
            else:
                errors[rank] = payload
                deadline = min(deadline, time.monotonic() + 2)  # let the root cause arrive
    finally:
        _stop(procs)
    if errors or len(done) < world_size:
        raise RankFailed(_failure_report(procs, done, errors, world_size))
    return [done[rank] for rank in range(world_size)]


def _dead(procs: list[Any], done: dict[int, Any]) -> bool:
    """A rank that exited with an error code before reporting (a crash, ``os._exit``)."""
    return any(
        proc.exitcode not in (None, 0) for rank, proc in enumerate(procs) if rank not in done
    )


def _check_deadline(
    procs: list[Any], done: dict[int, Any], deadline: float, deadline_s: float
) -> None:
    if time.monotonic() > deadline:
        missing = [rank for rank in range(len(procs)) if rank not in done]
        raise RankFailed(
            f"ranks {missing} gave no result within {deadline_s:g} s: "
            "one rank waits on a collective its peers never call, or raise deadline_s"
        )


def _failure_report(
    procs: list[Any], done: dict[int, Any], errors: dict[int, str], world_size: int
) -> str:
    """The root cause first: a rank that died, then the first traceback in full."""
    lines = [
        f"rank {rank} exited with code {proc.exitcode} before returning a result"
        for rank, proc in enumerate(procs)
        if rank not in done and rank not in errors and proc.exitcode not in (None, 0, -15)
    ]
    for rank in errors:  # in order of arrival
        if not lines:
            lines.append(f"rank {rank} of {world_size} raised:\n{errors[rank]}")
        else:
            last = errors[rank].strip().splitlines()[-1]
            lines.append(f"rank {rank} of {world_size} then raised: {last}")
    return "\n".join(lines) or f"ranks {sorted(set(range(world_size)) - set(done))} failed"


def _stop(procs: list[Any]) -> None:
    """End every worker we started (and only those): terminate, then kill stragglers."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join()


# --8<-- [end:run_on_ranks]


# --8<-- [start:demo]
def whoami() -> str:
    """What every rank knows about itself, and one collective to prove they are connected."""
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)  # 0 + 1 + ... + (world - 1) on every rank
    return f"rank {rank} of {world} on {dist.get_backend()}: sum of ranks = {total.item():g}"


def demo(world_size: int = 4) -> None:
    for line in run_on_ranks(whoami, world_size):
        print(line)


# --8<-- [end:demo]
