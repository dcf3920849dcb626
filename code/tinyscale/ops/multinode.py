# --8<-- [start:header]
"""Several nodes, one job: rank ranges, checks before the rendezvous, barrier timings.

Launch:  python code/scripts/fake_multi_node_launcher.py --nnodes 2 --nproc-per-node 2 -- --max-steps 3
Worker:  torchrun --nnodes 2 --node-rank 0 --nproc-per-node 2 --master-addr 127.0.0.1 \
             --master-port 29500 -m tinyscale.ops.multinode code/scripts/ddp_simulation_train.py

A job of NNODES nodes with NPROC_PER_NODE processes each has NNODES x NPROC_PER_NODE
ranks. Node k owns the consecutive block of global ranks k*P .. k*P+P-1, and every
process on it gets a LOCAL_RANK 0..P-1 that picks its GPU. This module holds that
arithmetic, the checks a launcher makes before any agent starts (a node rank outside
the job, a port in use, a rendezvous address nobody answers on), the worker entry point
that prints what every process was told, and timed barriers for Lab 3.
"""

import errno
import math
import os
import re
import runpy
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from tinyscale.core.errors import UsageError

# --8<-- [end:header]


# --8<-- [start:ranks]
def node_rank_range(node_rank: int, nproc_per_node: int) -> range:
    """The global ranks of node ``node_rank`` (counted from 0): k*P .. k*P+P-1."""
    start = node_rank * nproc_per_node
    return range(start, start + nproc_per_node)


def locate_rank(rank: int, nproc_per_node: int) -> tuple[int, int]:
    """The other way round: which node holds a global rank, and its local rank there."""
    return divmod(rank, nproc_per_node)  # (node rank, local rank)


def expected_env(
    nnodes: int, nproc_per_node: int, master_addr: str, master_port: int
) -> list[dict[str, str]]:
    """What torchrun tells every process of the job, by global rank (static rendezvous)."""
    return [
        {
            "NODE_RANK": str(node),
            "GROUP_RANK": str(node),
            "LOCAL_RANK": str(local),
            "RANK": str(rank),
            "WORLD_SIZE": str(nnodes * nproc_per_node),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
        }
        for node in range(nnodes)
        for local, rank in enumerate(node_rank_range(node, nproc_per_node))
    ]


# --8<-- [end:ranks]


# --8<-- [start:checks]
def check_layout(nnodes: int, nproc_per_node: int, node_rank: int | None = None) -> None:
    """NNODES, NPROC_PER_NODE and NODE_RANK must describe one job: node ranks are 0..NNODES-1."""
    if nnodes < 1 or nproc_per_node < 1:
        raise UsageError(
            f"--nnodes {nnodes} --nproc-per-node {nproc_per_node}: both must be at least 1"
        )
    if node_rank is not None and not 0 <= node_rank < nnodes:
        raise UsageError(
            f"NODE_RANK {node_rank} does not fit NNODES {nnodes}: node ranks are "
            f"0..{nnodes - 1}, counted from 0 (the first node is 0)"
        )


def check_port_free(addr: str, port: int) -> None:
    """Node 0 hosts the rendezvous at addr:port: we must be able to listen there (bind test)."""
    if not 0 < port < 65536:
        raise UsageError(f"MASTER_PORT {port} is not a TCP port: use 1024..65535")
    with socket.socket() as sock:
        try:
            sock.bind((addr, port))
        except OSError as err:
            known = {errno.EADDRINUSE: "in use", errno.EADDRNOTAVAIL: "not an address of ours"}
            why = known.get(err.errno, err.strerror or str(err))  # or: unknown host name
            raise UsageError(
                f"cannot listen on MASTER_ADDR:MASTER_PORT {addr}:{port}: {why}; node 0 "
                "hosts the rendezvous, so use one of its addresses and a free port"
            ) from None


def wait_reachable(addr: str, port: int, timeout_s: float) -> None:
    """A node other than 0 connects to node 0: retry until the rendezvous answers, or give up.

    "Connection refused" just means node 0 is not up yet (start order is free); silence
    until the deadline means a wrong address, a firewall, or a node 0 that never came.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((addr, port), timeout=max(0.1, min(left, 2.0))):
                return
        except OSError:  # refused (nothing listens yet), timed out, unreachable
            pass
        if time.monotonic() >= deadline:
            raise UsageError(
                f"nobody answers at MASTER_ADDR:MASTER_PORT {addr}:{port} after {timeout_s:g} s: "
                "start node 0 first, and set MASTER_ADDR to its address"
            )
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


# --8<-- [end:checks]


# --8<-- [start:whoami]
ENV_KEYS = ("NODE_RANK", "GROUP_RANK", "LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR")
ENV_KEYS += ("MASTER_PORT",)


def env_line(environ: Mapping[str, str] | None = None) -> str:
    """One line with what this process was told. GROUP_RANK is torchrun's name for the node
    rank; NODE_RANK is what the scheduler (here: our launcher) exported to the node."""
    env = os.environ if environ is None else environ
    return "whoami | " + " ".join(f"{key}={env.get(key, '-')}" for key in ENV_KEYS)


def parse_env_line(line: str) -> dict[str, str] | None:
    """The fields of an ``env_line``, or None for any other line."""
    if not line.startswith("whoami | "):
        return None
    return dict(field.split("=", 1) for field in line[len("whoami | ") :].split())


def run_script(argv: Sequence[str]) -> None:
    """``python -m tinyscale.ops.multinode SCRIPT ARGS``: print who I am, then run SCRIPT as main."""
    if not argv:
        raise SystemExit("usage: python -m tinyscale.ops.multinode SCRIPT [ARGS...]")
    print(env_line(), flush=True)
    sys.argv = list(argv)  # the script parses its own arguments, as if started directly
    runpy.run_path(argv[0], run_name="__main__")


# --8<-- [end:whoami]


# --8<-- [start:barrier]
NEVER = math.inf  # a delay meaning: this rank never reaches the barrier


def timed_barrier(
    delays: Sequence[float], monitored: bool = False, timeout_s: float = 10.0
) -> dict[str, Any]:
    """Rank r works for delays[r] seconds, then waits at a barrier; when did it arrive and leave?

    Run it on every rank: ``run_on_ranks(timed_barrier, world, delays, monitored, timeout_s)``
    (the arguments are positional for that reason). A rank whose delay is NEVER skips the
    barrier; the others wait until the timeout and raise: ``dist.barrier()`` after the
    process group's timeout, ``dist.monitored_barrier`` (gloo only) after ``timeout_s``,
    naming the rank that did not come. Times are ``time.time()``: one clock for all
    ranks on one machine (across real nodes, compare durations only).
    """
    rank = dist.get_rank()
    dist.barrier()  # line everyone up first, so that the delays are the only difference
    start = time.time()
    if delays[rank] == NEVER:
        time.sleep(timeout_s + 2)  # alive, busy elsewhere: the others time out meanwhile
        return {"rank": rank, "start": start, "arrived": None, "released": None, "error": None}
    time.sleep(delays[rank])  # this rank's "work": a slow data loader, a slow node
    arrived = time.time()
    error = None
    try:
        if monitored:
            dist.monitored_barrier(timeout=timedelta(seconds=timeout_s))
        else:
            dist.barrier()  # returns when the last rank has arrived
    except RuntimeError as err:
        # the first line, without gloo's source location "[/path/to/file.cc:78] "
        error = re.sub(r"^\[\S+:\d+\] ", "", str(err).strip().splitlines()[0])
    return {
        "rank": rank,
        "start": start,
        "arrived": arrived,
        "released": time.time(),
        "error": error,
    }


def barrier_report(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per rank: arrival, release and wait, in seconds after the earliest start."""
    t0 = min(r["start"] for r in results)
    lines = []
    for r in results:
        if r["arrived"] is None:
            lines.append(f"rank {r['rank']}: never arrived")
            continue
        arrived, released = r["arrived"] - t0, r["released"] - t0
        lines.append(
            f"rank {r['rank']}: arrived {arrived:5.2f} s | released {released:5.2f} s | "
            f"waited {released - arrived:5.2f} s" + (f" | {r['error']}" if r["error"] else "")
        )
    return lines


# --8<-- [end:barrier]


# --8<-- [start:main]
if __name__ == "__main__":
    run_script(sys.argv[1:])
# --8<-- [end:main]
