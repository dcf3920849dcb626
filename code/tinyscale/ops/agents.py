# --8<-- [start:header]
"""A launcher's agents: stop one with every process it started; wait for all, at most a
timeout, the first failure stopping the rest.

Launch:  python code/scripts/fake_multi_node_launcher.py --nnodes 2 --nproc-per-node 2 -- --max-steps 3

SLURM does this for a job (``--kill-on-bad-exit``); Lab 3's launcher plays SLURM's part on
one machine, one torchrun agent per simulated node, and uses these to end them. torchrun
puts its workers in sessions of their own, so stopping an agent means finding its
descendants first: from /proc on Linux, from ps on macOS.
"""
# --8<-- [end:header]

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path


# --8<-- [start:wait]
def process_table(proc: Path = Path("/proc")) -> dict[int, tuple[int, str]]:
    """Every process as pid -> (parent pid, start time): from /proc on Linux, from ps on
    macOS, which has no /proc. The start time tells a process from a later one that got
    its pid."""
    table: dict[int, tuple[int, str]] = {}
    if not proc.is_dir():
        ps = ["ps", "-A", "-o", "pid=,ppid=,lstart="]  # lstart: the start time, in words
        listing = subprocess.run(ps, capture_output=True, text=True, check=True).stdout
        for line in listing.splitlines():
            pid, ppid, started = line.split(None, 2)
            table[int(pid)] = (int(ppid), started.strip())
        return table
    for stat in proc.glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # the process ended meanwhile
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (name)"
            table[int(stat.parent.name)] = (int(fields[1]), fields[19])
    return table


def descendants(pid: int) -> list[tuple[int, str]]:
    """Every process started by ``pid``, as (pid, start time).

    torchrun puts its workers in sessions of their own, so signalling the agent's process
    group misses them.
    """
    children: dict[int, list[tuple[int, str]]] = {}
    for kid, (parent, started) in process_table().items():
        children.setdefault(parent, []).append((kid, started))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += [kid for kid, _ in kids]
    return found


def stop(agent: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to the agent's process group (torchrun passes it on to its workers), then
    SIGKILL to whatever of that agent's family is still there after ``grace_s``."""
    family = descendants(agent.pid)
    if agent.poll() is None:
        os.killpg(agent.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        agent.wait(timeout=grace_s)
    if agent.poll() is None:
        os.killpg(agent.pid, signal.SIGKILL)
    now = process_table()
    for pid, started in family:
        if now.get(pid, (0, ""))[1] == started:  # gone, or its pid reused: leave it
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    agent.wait()


def wait_all(agents: dict[int, subprocess.Popen], timeout_s: float) -> dict[int, str]:
    """Wait for every agent, at most ``timeout_s``; the first failure stops all the others
    (SLURM's --kill-on-bad-exit): they would only wait for a dead peer until their timeout."""
    deadline = time.monotonic() + timeout_s
    status: dict[int, str] = {}
    while len(status) < len(agents):
        for node, agent in agents.items():
            if node not in status and agent.poll() is not None:
                status[node] = f"exit code {agent.returncode}"
        failed = any(a.returncode not in (None, 0) for a in agents.values())
        late = time.monotonic() > deadline
        if failed or late:
            for node, agent in agents.items():
                if node not in status:
                    stop(agent)
                    why = f"--timeout {timeout_s:g} s" if late else "another node failed"
                    status[node] = f"stopped ({why})"
        time.sleep(0.2)
    return status


# --8<-- [end:wait]
