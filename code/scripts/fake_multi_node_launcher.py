# --8<-- [start:args]
"""Lab 3: N simulated nodes on this machine, each a real torchrun agent, one rendezvous.

Launch:  python code/scripts/fake_multi_node_launcher.py --nnodes 2 --nproc-per-node 2 -- --max-steps 3
One node only (the others started elsewhere, e.g. in another terminal):
         python code/scripts/fake_multi_node_launcher.py --nnodes 2 --node-rank 1 --master-port 29500
         NODE_RANK=1 MASTER_PORT=29500 python code/scripts/fake_multi_node_launcher.py  # the same

On a cluster you never type torchrun: SLURM starts one torchrun per node and sets the
variables that say which node it is. This script plays SLURM's part on one machine: it
starts one `torchrun --nnodes N --node-rank k` agent per simulated node, all meeting at
127.0.0.1, waits for them with a bounded timeout, stops them all if one fails, and
prints who every process was told it is. Arguments after `--` go to the training script.
"""

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tinyscale.comm.launch import free_port
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.core.outputs import check_writable
from tinyscale.ops.agents import stop, wait_all
from tinyscale.ops.multinode import (
    check_layout,
    check_port_free,
    expected_env,
    node_rank_range,
    parse_env_line,
    wait_reachable,
)

SCRIPT = "code/scripts/ddp_simulation_train.py"


def env_int(name: str) -> int | None:
    """An integer from the environment, as a scheduler would export it; None if unset."""
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise UsageError(
            f"{name}={value!r} is not a whole number: export {name}=0, 1, ..."
        ) from None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Flags, or else the variables a scheduler exports: NNODES, NODE_RANK, MASTER_ADDR/PORT."""
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    nnodes = env_int("NNODES")
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nnodes", type=int, default=2 if nnodes is None else nnodes, help="NNODES")
    p.add_argument("--nproc-per-node", type=int, default=1, help="processes per node (GPUs)")
    p.add_argument(
        "--node-rank", type=int, default=env_int("NODE_RANK"), help="start only this node"
    )
    p.add_argument("--master-addr", default=os.environ.get("MASTER_ADDR", "127.0.0.1"))
    p.add_argument("--master-port", type=int, default=env_int("MASTER_PORT"), help="default: free")
    p.add_argument("--rdzv-timeout", type=float, default=30.0, help="s an agent waits for peers")
    p.add_argument("--timeout", type=float, default=600.0, help="s for the whole job, then stop")
    p.add_argument("--log-dir", default="runs/lab3/nodes", help="one node_<k>.log per agent")
    p.add_argument("--script", default=SCRIPT, help="what every process runs")
    args = p.parse_args(argv[:split])
    args.script_args = argv[split + 1 :]  # everything after `--`, untouched
    return args


# --8<-- [end:args]


# --8<-- [start:check]
def check_inputs(args: argparse.Namespace) -> list[int]:
    """Every bad input is a one-line error before any agent starts; returns the nodes to start."""
    check_layout(args.nnodes, args.nproc_per_node, args.node_rank)
    for name in ("rdzv_timeout", "timeout"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
    if Path(args.script).is_dir():
        raise UsageError(f"--script {args.script} is a folder: pass a Python file, e.g. {SCRIPT}")
    if not Path(args.script).is_file():
        raise UsageError(f"--script {args.script} not found: run from the repository root")
    if args.master_port is None:
        if args.node_rank not in (None, 0):
            raise UsageError("--node-rank > 0 joins node 0's rendezvous: give its --master-port")
        args.master_port = free_port()
    nodes = list(range(args.nnodes)) if args.node_rank is None else [args.node_rank]
    for node in nodes:  # each agent's log: a file in the way is one line, not a traceback
        check_writable(args.log_dir, "--log-dir", f"node_{node}.log", file=True)
    if 0 in nodes:  # we host the rendezvous: the address must be ours and the port free
        check_port_free(args.master_addr, args.master_port)
    else:  # we join one hosted elsewhere: someone must answer there, within the timeout
        wait_reachable(args.master_addr, args.master_port, args.rdzv_timeout)
    return nodes


# --8<-- [end:check]


# --8<-- [start:agents]
def agent_command(args: argparse.Namespace, node_rank: int) -> list[str]:
    """What SLURM would run on node k: one torchrun agent, told its node rank.

    Static rendezvous (torchrun's default when given --master-addr/--master-port): node
    rank k is exactly --node-rank k, and node 0's agent hosts the meeting point. (The
    SLURM file uses c10d instead: one command line for every node, no per-node value,
    and ranks numbered in order of arrival; restarts need it too.)
    """
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(args.nnodes),
        "--node-rank", str(node_rank),
        "--nproc-per-node", str(args.nproc_per_node),
        "--master-addr", args.master_addr,
        "--master-port", str(args.master_port),
        "--rdzv-conf", f"timeout={args.rdzv_timeout:g}",  # how long agents wait for peers
        "--max-restarts", "0",
        "-m", "tinyscale.ops.multinode",  # prints what this process was told, then runs:
        args.script, *args.script_args,
    ]  # fmt: skip


def start_agent(args: argparse.Namespace, node_rank: int) -> subprocess.Popen:
    """One agent in its own process group, output in <log-dir>/node_<k>.log."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),  # processes share cores
        # what a scheduler exports on node k (SLURM: SLURM_NODEID, SLURM_NNODES)
        "NODE_RANK": str(node_rank),
        "NNODES": str(args.nnodes),
        "MASTER_ADDR": args.master_addr,
        "MASTER_PORT": str(args.master_port),
    }
    log = open(Path(args.log_dir) / f"node_{node_rank}.log", "w")  # noqa: SIM115 (child owns it)
    with log:
        return subprocess.Popen(
            agent_command(args, node_rank),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: we can stop it and only it
        )


# --8<-- [end:agents]


# --8<-- [start:report]
ERROR_LINE = re.compile(r"^(?:\[rank\d+\]: )?[\w.]+(?:Error|Exception): ")


def node_report(args: argparse.Namespace, nodes: list[int], status: dict[int, str]) -> bool:
    """Who every process said it is (checked against the rank arithmetic), and how each
    node ended, with the first error line of its log: the root cause comes first, torchrun's
    own report of it (ChildFailedError) after. True if every node succeeded."""
    seen: dict[int, dict[str, str]] = {}
    errors: dict[int, str] = {}
    for node in nodes:
        for line in (Path(args.log_dir) / f"node_{node}.log").read_text().splitlines():
            if (fields := parse_env_line(line)) is not None:
                seen[int(fields["RANK"])] = fields
            elif ERROR_LINE.match(line):
                errors.setdefault(node, line[:200])
    if seen:
        keys = list(next(iter(seen.values())))
        print("  ".join(keys))
        for rank in sorted(seen):
            print("  ".join(f"{seen[rank][k]:>{len(k)}}" for k in keys))
    expected = expected_env(args.nnodes, args.nproc_per_node, args.master_addr, args.master_port)
    mine = [e for e in expected if int(e["NODE_RANK"]) in nodes]
    as_expected = [seen.get(int(e["RANK"])) for e in mine] == mine
    for node in nodes:
        error = f": {errors[node]}" if node in errors and status[node] != "exit code 0" else ""
        print(f"node {node}: {status[node]}{error}")
    ok = [node for node in nodes if status[node] == "exit code 0"]
    if len(ok) == len(nodes):
        print(
            f"{len(nodes)}/{len(nodes)} nodes finished: world size {len(expected)}, every rank "
            f"where NODE_RANK x {args.nproc_per_node} + LOCAL_RANK says: {as_expected}"
        )
        return as_expected
    stopped = sum(status[node].startswith("stopped") for node in nodes)
    failed = len(nodes) - len(ok) - stopped
    print(
        f"{failed} failed, {stopped} stopped, {len(ok)} finished: see {args.log_dir}/node_<k>.log"
    )
    return False


# --8<-- [end:report]


# --8<-- [start:main]
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    nodes = check_inputs(args)
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    world = args.nnodes * args.nproc_per_node
    print(
        f"rendezvous at {args.master_addr}:{args.master_port} (static): {args.nnodes} nodes x "
        f"{args.nproc_per_node} per node = world size {world}"
    )
    for node in nodes:
        ranks = node_rank_range(node, args.nproc_per_node)
        print(f"node {node}: ranks {ranks[0]}..{ranks[-1]}, log {args.log_dir}/node_{node}.log")
    sys.stdout.flush()  # before the agents' output, when both go to one terminal
    agents: dict[int, subprocess.Popen] = {}
    try:
        for node in nodes:
            agents[node] = start_agent(args, node)
        status = wait_all(agents, args.timeout)
    finally:  # Ctrl-C, or any error of ours: leave nothing running
        for agent in agents.values():
            if agent.poll() is None:
                stop(agent)
    return 0 if node_report(args, nodes, status) else 1


if __name__ == "__main__":
    sys.exit(run_cli(main))
# --8<-- [end:main]
