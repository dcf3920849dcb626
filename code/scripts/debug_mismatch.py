# --8<-- [start:mismatch]
"""Two ranks call different collectives: what TORCH_DISTRIBUTED_DEBUG=DETAIL reports.

Launch:  TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --nproc_per_node=2 code/scripts/debug_mismatch.py

Rank 0 all-reduces while every other rank all-gathers — the bug of a collective called
inside an ``if rank == 0``. Without DETAIL the ranks wait for each other until the
process group's timeout; with DETAIL every collective is first checked across ranks
(its type and its tensors' shapes), and the mismatch is an immediate error naming both.
"""

import torch
import torch.distributed as dist

from tinyscale.comm.dist import distributed


def main() -> None:
    with distributed("cpu", timeout_s=10) as (env, _):
        t = torch.ones(4)
        if env.rank == 0:
            dist.all_reduce(t)  # rank 0 sums ...
        else:
            dist.all_gather(
                [torch.empty(4) for _ in range(env.world_size)], t
            )  # ... the rest gather


if __name__ == "__main__":
    main()
# --8<-- [end:mismatch]
