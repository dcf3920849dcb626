# --8<-- [start:table]
"""The environment variables that steer NCCL, torch's NCCL process group and gloo: what is set
here, what it means, and the combinations that are known to hurt.

Launch:  python -m tinyscale.ops.nccl_env

Names checked against the libraries torch 2.14.1 ships (libnccl.so.2 2.30.7, libtorch,
libc10): tests/tinyscale/ops/test_nccl_env.py finds every name below in one of them.
"""

import dataclasses
import os
from collections.abc import Mapping, Sequence

from tinyscale.core.errors import ArgumentParser, run_cli


@dataclasses.dataclass(frozen=True)
class EnvVar:
    name: str
    layer: str  # who reads it: NCCL (the library), torch (its process groups), gloo
    meaning: str


VARS = (
    EnvVar("NCCL_DEBUG", "NCCL", "log level: VERSION, WARN, INFO, TRACE; INFO for a first run"),
    EnvVar("NCCL_DEBUG_SUBSYS", "NCCL", "which subsystems log, e.g. INIT,NET,GRAPH"),
    EnvVar("NCCL_DEBUG_FILE", "NCCL", "log to a file per process: %h host, %p pid"),
    EnvVar("NCCL_SOCKET_IFNAME", "NCCL", "network interface for bootstrap and sockets, e.g. eth0"),
    EnvVar("NCCL_IB_HCA", "NCCL", "which InfiniBand/RoCE adapters (HCAs) to use, e.g. mlx5"),
    EnvVar("NCCL_IB_DISABLE", "NCCL", "1: no InfiniBand/RoCE, fall back to TCP sockets"),
    EnvVar("NCCL_P2P_DISABLE", "NCCL", "1: no direct GPU-to-GPU copies (NVLink, PCIe)"),
    EnvVar("NCCL_SHM_DISABLE", "NCCL", "1: no shared-memory transport inside a node"),
    EnvVar("NCCL_NET_GDR_LEVEL", "NCCL", "how close NIC and GPU must be for GPUDirect RDMA"),
    EnvVar("NCCL_ALGO", "NCCL", "force algorithms, e.g. Ring or Tree (experiments only)"),
    EnvVar("NCCL_PROTO", "NCCL", "force protocols: LL, LL128, Simple (experiments only)"),
    EnvVar("NCCL_MIN_NCHANNELS", "NCCL", "at least this many channels (parallel rings/trees)"),
    EnvVar("NCCL_MAX_NCHANNELS", "NCCL", "at most this many channels"),
    EnvVar("NCCL_IB_TIMEOUT", "NCCL", "InfiniBand retransmission timeout (exponent)"),
    EnvVar("NCCL_TOPO_DUMP_FILE", "NCCL", "write the topology NCCL detected to this XML file"),
    EnvVar(
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "torch",
        "when a collective fails or times out: 0 "
        "nothing, 1 abort NCCL and exit, 2 abort NCCL only, 3 exit without abort",
    ),
    EnvVar("TORCH_NCCL_BLOCKING_WAIT", "torch", "1: wait() blocks and raises on timeout"),
    EnvVar("TORCH_NCCL_DUMP_ON_TIMEOUT", "torch", "1: dump the flight recorder on a timeout"),
    EnvVar("TORCH_NCCL_TRACE_BUFFER_SIZE", "torch", "flight recorder entries (old name)"),
    EnvVar("TORCH_FR_BUFFER_SIZE", "torch", "flight recorder entries, any backend (0: off)"),
    EnvVar("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "torch", "where dumps go: prefix + rank"),
    EnvVar("TORCH_NCCL_ENABLE_MONITORING", "torch", "1: a heartbeat thread kills a stuck watchdog"),
    EnvVar("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "torch", "seconds before that thread acts"),
    EnvVar("TORCH_DISTRIBUTED_DEBUG", "torch", "OFF, INFO, DETAIL: DETAIL checks every collective"),
    EnvVar("TORCH_CPP_LOG_LEVEL", "torch", "C++ log level: INFO shows process-group set-up"),
    EnvVar("GLOO_SOCKET_IFNAME", "gloo", "gloo's network interface (NCCL_SOCKET_IFNAME's twin)"),
)
KNOWN = {v.name: v for v in VARS}
# --8<-- [end:table]


# --8<-- [start:checks]
RENAMED = {
    "NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_TRACE_BUFFER_SIZE": "TORCH_FR_BUFFER_SIZE",
}


def warnings_for(env: Mapping[str, str]) -> list[str]:
    """Settings that are wrong, or right only for an experiment."""
    out = [
        f"{old} is the old name: torch reads {new}"
        for old, new in RENAMED.items()
        if old in env and new not in env
    ]
    if "NCCL_TIMEOUT" in env:
        out.append("NCCL_TIMEOUT does nothing: pass timeout= to init_process_group")
    if env.get("NCCL_IB_DISABLE") == "1" and "NCCL_IB_HCA" in env:
        out.append("NCCL_IB_HCA is ignored while NCCL_IB_DISABLE=1: traffic goes over TCP")
    if env.get("NCCL_P2P_DISABLE") == "1":
        out.append("NCCL_P2P_DISABLE=1 turns NVLink off: a debugging setting, slow in production")
    for name in ("NCCL_ALGO", "NCCL_PROTO"):
        if name in env:
            out.append(f"{name}={env[name]} overrides NCCL's own choice: remove after the test")
    multi_node = int(env.get("WORLD_SIZE", 1)) > int(env.get("LOCAL_WORLD_SIZE", 1))
    for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        if multi_node and env.get(name, "").startswith("lo"):
            out.append(f"{name}={env[name]} is loopback: other nodes cannot reach it")
    if env.get("NCCL_DEBUG", "").upper() == "TRACE":
        out.append("NCCL_DEBUG=TRACE logs every call: use INFO or WARN for real runs")
    return out


def describe(env: Mapping[str, str]) -> list[str]:
    """One line per variable that is set here, then the warnings."""
    names = sorted(n for n in env if n in KNOWN or n in RENAMED or n == "NCCL_TIMEOUT")
    lines = [f"{n}={env[n]}  ({KNOWN[n].meaning if n in KNOWN else 'see below'})" for n in names]
    if not lines:
        lines.append("no NCCL, torch-distributed or gloo variable is set: the defaults apply")
    lines += [f"warning: {w}" for w in warnings_for(env)]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="list every variable this knows")
    args = parser.parse_args(argv)
    if args.all:
        for v in VARS:
            print(f"{v.name:<34} {v.layer:<6} {v.meaning}")
        return 0
    print("\n".join(describe(os.environ)))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
# --8<-- [end:checks]
