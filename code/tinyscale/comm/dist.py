# --8<-- [start:env]
"""Who am I, how many are we, where do we meet: process groups from the launcher's environment.

Launch:  torchrun --nproc_per_node=2 code/scripts/ddp_simulation_train.py

torchrun (and SLURM's srun) start N copies of the same script and tell each one its
place through environment variables. This module reads them, picks the backend
(gloo on CPU, nccl on CUDA), joins the process group with a timeout — so a missing
peer is an error after a bounded wait, never a silent hang — and gives every rank
its own log file.
"""

import dataclasses
import gc
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.rendezvous import rendezvous

from tinyscale.core.device import select_device
from tinyscale.core.errors import UsageError


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistEnv:
    """One process's place in the job."""

    rank: int  # 0 .. world_size-1, unique across all nodes
    local_rank: int  # 0 .. local_world_size-1, unique on this node: picks the GPU
    world_size: int  # processes in the job
    local_world_size: int  # processes on this node
    node_rank: int  # which node (torchrun: GROUP_RANK, SLURM: SLURM_NODEID)
    master_addr: str  # where rank 0 listens for the rendezvous
    master_port: int
    launcher: str  # "torchrun" or "slurm"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


# --8<-- [end:env]


# --8<-- [start:from_environ]
def dist_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Read the variables torchrun sets, or map SLURM's onto them.

    torchrun: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT.
    srun:     SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NTASKS_PER_NODE, SLURM_NODEID
              (and SLURM_STEP_ID: only srun's tasks have one); MASTER_ADDR/PORT come
              from the batch script.
    """
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        launcher = "torchrun"
        rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank = int(env.get("LOCAL_RANK", rank))
        local_world_size = int(env.get("LOCAL_WORLD_SIZE", world_size))
        node_rank = int(env.get("GROUP_RANK", env.get("NODE_RANK", 0)))
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        launcher = "slurm"
        rank, world_size = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        # The batch script itself also sees SLURM_PROCID=0 and the job's SLURM_NTASKS, but
        # it is one process, not a task of a step: started there, rank 0 would wait for
        # ranks that never come. Only srun's tasks have a step id.
        if "SLURM_STEP_ID" not in env and world_size > 1:
            raise UsageError(
                f"started in the batch script of SLURM job {env.get('SLURM_JOB_ID', '?')}, not "
                f"by srun: launch it with `srun python ...` (one task per rank) or `srun torchrun ...`"
            )
        local_rank = int(env.get("SLURM_LOCALID", 0))
        # "2(x3)" style values list tasks per node; the first entry is this layout's width
        per_node = env.get("SLURM_NTASKS_PER_NODE", str(world_size)).split("(")[0].split(",")[0]
        local_world_size = int(per_node)
        node_rank = int(env.get("SLURM_NODEID", 0))
    else:
        raise UsageError(
            "not launched by torchrun or SLURM (no RANK/WORLD_SIZE): run "
            "`torchrun --nproc_per_node=2 <script>`, or set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"
        )
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not env.get(k)]
    if missing:
        raise UsageError(
            f"{' and '.join(missing)} not set: export MASTER_ADDR=<rank 0's host> "
            "MASTER_PORT=<free port>, or launch with torchrun, which sets them"
        )
    if not 0 <= rank < world_size or not 0 <= local_rank < local_world_size:
        raise UsageError(
            f"inconsistent ranks: RANK={rank} WORLD_SIZE={world_size} LOCAL_RANK={local_rank} "
            f"LOCAL_WORLD_SIZE={local_world_size}: check the launcher's settings"
        )
    return DistEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=node_rank,
        master_addr=env["MASTER_ADDR"],
        master_port=int(env["MASTER_PORT"]),
        launcher=launcher,
    )


# --8<-- [end:from_environ]


# --8<-- [start:init]
def device_for(env: DistEnv, device: str = "auto") -> torch.device:
    """One GPU per process, chosen by LOCAL_RANK; on CPU every process shares the cores."""
    return select_device(device, local_rank=env.local_rank)


def backend_for(device: torch.device) -> str:
    """nccl moves CUDA tensors GPU-to-GPU; gloo moves CPU tensors over TCP."""
    return "nccl" if device.type == "cuda" else "gloo"


@contextmanager
def distributed(
    device: str = "auto", *, timeout_s: float = 60.0
) -> Iterator[tuple[DistEnv, torch.device]]:
    """Join the process group for the duration of a ``with`` block, and always leave it.

    ``timeout_s`` bounds every collective: a rank that waits longer for its peers
    raises instead of hanging forever.
    """
    env = dist_env()
    dev = device_for(env, device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    timeout = timedelta(seconds=timeout_s)
    # Meet at MASTER_ADDR:MASTER_PORT. Under torchrun the agent hosts this key-value store
    # and keeps it across elastic restarts, so each attempt gets its own key prefix: a
    # restarted rank must never read the addresses its dead predecessor published.
    url = f"tcp://{env.master_addr}:{env.master_port}?rank={env.rank}&world_size={env.world_size}"
    store, _, _ = next(rendezvous(url, timeout=timeout))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(
        backend=backend_for(dev),
        store=dist.PrefixStore(f"tinyscale/attempt_{attempt}", store),
        rank=env.rank,
        world_size=env.world_size,
        timeout=timeout,
    )
    try:
        yield env, dev
    finally:
        # DDP's hooks form reference cycles, so a finished model lingers until the garbage
        # collector runs; collect now, while Python is fully alive, not at interpreter
        # shutdown, where tearing down its gloo state can abort a run that succeeded.
        gc.collect()
        dist.destroy_process_group()


# --8<-- [end:init]


# --8<-- [start:logging]
def fresh_logger(name: str, path: Path, level: int = logging.INFO) -> logging.Logger:
    """A named logger with no handlers yet (closing any from an earlier run in this
    process), not propagating to the root logger; creates the folder of ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger(name)
    logger.setLevel(level)
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    return logger


def rank_logger(env: DistEnv, log_dir: str | Path = "logs") -> logging.Logger:
    """A logger that writes ``<log_dir>/rank_<N>/train.log``; rank 0 also echoes to stdout."""
    path = Path(log_dir) / f"rank_{env.rank}" / "train.log"
    logger = fresh_logger(f"tinyscale.rank{env.rank}", path)
    fmt = logging.Formatter(
        f"%(asctime)s rank {env.rank}/{env.world_size} local_rank {env.local_rank} | %(message)s"
    )
    # a restarted attempt appends: the log of the attempt that failed is evidence, keep it
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    handlers: list[logging.Handler] = [logging.FileHandler(path, mode="a" if restarted else "w")]
    if env.is_main:
        handlers.append(logging.StreamHandler(sys.stdout))
    for handler in handlers:
        handler.setFormatter(fmt)
        logger.addHandler(handler)
    return logger


# --8<-- [end:logging]


# --8<-- [start:checks]
def require_process_group(what: str) -> None:
    """One line instead of torch's "Default process group has not been initialized"."""
    if not dist.is_initialized():
        raise UsageError(
            f"{what} needs a process group: call dist.init_process_group first "
            "(or run under torchrun / tinyscale.comm.launch.run_on_ranks)"
        )


def rank_spread(tensor: torch.Tensor) -> float:
    """The largest |x - x on rank 0| over every element and every rank: 0.0 = bit-identical.

    Every rank calls it with its own copy of the same thing: the flat parameters, or a
    cheaper fingerprint of them. Two collectives: rank 0's copy to everyone, then the
    largest difference back to everyone.
    """
    rank0 = tensor.clone()
    dist.broadcast(rank0, src=0)
    spread = (tensor - rank0).abs().max()
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    return spread.item()


# --8<-- [end:checks]


# --8<-- [start:flat]
def in_one_call(
    tensors: Sequence[torch.Tensor], collective: Callable[[torch.Tensor], object]
) -> None:
    """Run ``collective`` once on many tensors: flatten them into one buffer, call it on
    the buffer (it works in place), and copy the result back into each tensor.

    One message instead of one per tensor: what DDP's buckets do, for a handful of
    gradients or weights (Week 4's norms, ZeRO-1's owners).
    """
    flat = torch.cat([t.flatten() for t in tensors])
    collective(flat)
    for t, new in zip(tensors, flat.split([t.numel() for t in tensors]), strict=True):
        t.copy_(new.view_as(t))


# --8<-- [end:flat]


# --8<-- [start:exit]
def exit_without_teardown(code: int | None) -> None:  # it never returns
    """Leave the process now with ``code``: flush the logs and streams, skip the teardown.

    A job that has finished and left its process group can still die in the interpreter's
    teardown, when torch's C++ state is destroyed ("terminate called without an active
    exception", SIGABRT): a finished run reported as failed, about once in 20 CI runs.
    Everything worth keeping is written by then, so the training scripts end this way.
    """
    logging.shutdown()  # every rank's train.log, flushed and closed
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)  # None: torchrun's @record hands back a clean exit (--help) as None


# --8<-- [end:exit]
