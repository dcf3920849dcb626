# --8<-- [start:header]
"""Does DDP's all-reduce overlap the backward? One profiled DDP step per bucket size, read.

Try it:  python -m tinyscale.workflows.ddp_overlap

Profiles 2 gloo ranks, each training the Lab model (code/config/config.json) under torch's
DistributedDataParallel, one step per bucket size; counts in each rank's trace the
all-reduces, the backward ops that start after the first one, and the share of all-reduce
time during which the backward still runs. Writes the traces to runs/profiling/.
"""

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile

from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.config import load_model_config
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.core.model import TinyTransformer
from tinyscale.core.training import TrainConfig, make_optimizer
from tinyscale.workflows.profiling import BACKWARD, train_step, write_trace

# --8<-- [end:header]


# --8<-- [start:ddp]
def ddp_profiles(bucket_caps_mb: Sequence[float], trace_dir: str) -> list[dict[str, Any]]:
    """On each rank: for each bucket size, DDP over gloo, one profiled step, where its
    all-reduces fall in it. The same batches and weights for every bucket size."""
    rank, found = dist.get_rank(), []
    tokens = torch.randint(0, 1024, (8, 65), generator=torch.Generator().manual_seed(rank))
    batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())  # this rank's samples
    for cap in bucket_caps_mb:
        torch.manual_seed(0)
        model = TinyTransformer(dataclasses.replace(load_model_config(), dropout=0.0))
        ddp = DistributedDataParallel(model, bucket_cap_mb=cap)
        opt = make_optimizer(model, TrainConfig())
        for _ in range(2):  # DDP rebuilds its buckets after the first step: profile later
            train_step(ddp, opt, batch)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            train_step(ddp, opt, batch)
        name = f"ddp_bucket{cap:g}MB_rank{rank}.json"
        write_trace(prof, Path(trace_dir) / name)
        found.append({"bucket_cap_mb": cap, "trace": name, **overlap(prof.events())})
    return found


def overlap(events: Sequence[Any]) -> dict[str, Any]:
    """In one profiled step: the all-reduces, the backward ops that start after the first
    all-reduce began, and the share of all-reduce time during which backward ops run.

    gloo runs each all-reduce on a thread of its own (``gloo:all_reduce``); DDP launches it
    (``c10d::allreduce_``) from a gradient hook, as soon as a bucket's gradients are ready.
    """
    main = next(e for e in events if e.name == "train_step").thread
    backward = [e for e in events if e.thread == main and e.name.startswith(BACKWARD)
                and not e.name.endswith("AccumulateGrad")]  # fmt: skip
    launches = [e for e in events if e.name == "c10d::allreduce_"]
    gloo = [e for e in events if e.name == "gloo:all_reduce" and e.thread != main]
    first = min(e.time_range.start for e in launches)
    busy = sum(_intersection(g.time_range, b.time_range) for g in gloo for b in backward)
    return {
        "allreduces": len(launches),
        "backward_ops_after_first": sum(1 for e in backward if e.time_range.start > first),
        "overlapped": busy / sum(g.time_range.elapsed_us() for g in gloo),
    }


def _intersection(a: Any, b: Any) -> float:
    return max(0.0, min(a.end, b.end) - max(a.start, b.start))


# --8<-- [end:ddp]


# --8<-- [start:main]
def bucket_caps(text: str) -> list[float]:
    """'25,0.05' -> [25.0, 0.05]: DDP's bucket_cap_mb values, each above 0."""
    try:
        caps = [float(cap) for cap in text.split(",")]
    except ValueError:
        caps = []
    if not caps or not all(cap > 0 for cap in caps):
        raise UsageError(f"--bucket-cap-mb {text!r}: give sizes in MB above 0, e.g. 25,0.05")
    return caps


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bucket-cap-mb", default="25,0.05", help="DDP bucket sizes to compare")
    parser.add_argument("--trace-dir", type=Path, default=Path("runs/profiling"))
    args = parser.parse_args(argv)
    caps = bucket_caps(args.bucket_cap_mb)
    for rank, found in enumerate(run_on_ranks(ddp_profiles, 2, caps, str(args.trace_dir))):
        for one in found:
            print(f"rank {rank}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float)
                                               else f"{k} {v}" for k, v in one.items()))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
# --8<-- [end:main]
