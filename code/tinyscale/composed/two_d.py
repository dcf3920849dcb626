# --8<-- [start:header]
"""2D parallelism from the course's pieces: tensor parallel inside, ZeRO-1 data parallel across.

Try it:  python -c "from tinyscale.composed.two_d import demo; demo()"

The ranks form a dp x tp grid (a ParallelLayout, tp innermost). Each row of tp
consecutive ranks is one copy of the model, split by TensorParallelTransformer over its
tensor group. The dp copies train on different parts of the batch: their gradients are
averaged over the data-parallel group, and their optimizer state is sharded over it by
ShardedOptimizer. A rank's data-parallel group holds the same tensor shard on the other
copies, so every collective runs inside one group of the grid.
"""

import copy
import dataclasses

import torch
import torch.distributed as dist

from tinyscale.comm.comm_model import ring_allreduce_bytes
from tinyscale.comm.counter import CollectiveCounter
from tinyscale.comm.parallel_layout import ParallelLayout
from tinyscale.core.config import ModelConfig, preset
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel.memory_calculator import zero_step_bytes
from tinyscale.data_parallel.sharded_optimizer import ShardedOptimizer
from tinyscale.tensor_parallel.tp_model import TensorParallelTransformer
from tinyscale.tensor_parallel.tp_parity import split_difference

# --8<-- [end:header]


# --8<-- [start:formulas]
def tensor_step_bytes(
    cfg: ModelConfig, *, batch: int, seq_len: int, tp: int, element_size: int = 4
) -> float:
    """Bytes one rank sends to its tensor group in one training step, with rings (with
    SP: the same bytes, each all-reduce an all-gather and a reduce-scatter).

    All-reduces of (B, T, C): the embedding's (forward), 2 per block each way, the head's
    input gradient (backward); and 3 of one number per position for the loss.
    """
    bsh, bs = batch * seq_len * cfg.hidden_size, batch * seq_len
    elements = (4 * cfg.num_hidden_layers + 2) * bsh + 3 * bs
    return ring_allreduce_bytes(size_bytes=element_size * elements, world_size=tp)


# The data-parallel group's bytes are ZeRO-1's (memory_calculator.zero_step_bytes): a reduce
# of the gradients to their owners, then a broadcast of the new weights, (dp - 1)/dp of the
# rank's parameters each, as much as DDP's one all-reduce.


# --8<-- [end:formulas]


# --8<-- [start:train]
@dataclasses.dataclass
class TwoDRun:
    coordinate: dict[str, int]
    losses: list[float]  # the batch's mean loss, step by step
    loss: float  # the largest |loss - one process's loss| over the steps
    weights: float  # after the last step, against one process
    tensor_bytes: float  # sent to the tensor group per step, counted
    data_bytes: float  # sent to the data-parallel group per step, counted
    params: int  # parameters this rank holds
    state: int  # optimizer state elements this rank holds


def train_2d(dp: int, tp: int, steps: int = 3, batch: int = 4) -> TwoDRun:
    """One process's training, and the same on a dp x tp grid, side by side on every rank."""
    layout = ParallelLayout(dp_replicate=dp, tp=tp)
    built = layout.build()  # every group with the job's timeout
    where = layout.coordinate(dist.get_rank())
    data_group = built.group("dp_replicate")
    cfg = preset("tiny")
    torch.manual_seed(0)
    model = TinyTransformer(cfg)  # the reference: one process, the whole batch
    split = TensorParallelTransformer(copy.deepcopy(model), group=built.group("tp"))
    reference = torch.optim.AdamW(model.parameters(), lr=1e-2)
    optimizer = ShardedOptimizer(split.parameters(), torch.optim.AdamW, group=data_group, lr=1e-2)
    batches = torch.randint(0, cfg.vocab_size, (steps, 2, batch * dp, cfg.max_position_embeddings))
    mine = slice(
        where["dp_replicate"] * batch, (where["dp_replicate"] + 1) * batch
    )  # my copy's part of the batch
    tensor, data = CollectiveCounter(), CollectiveCounter()
    losses, loss_error = [], 0.0
    for x, y in batches:
        loss = model(x, y)[1]
        loss.backward()
        reference.step()
        reference.zero_grad()
        with tensor:  # forward and backward: the tensor group's collectives only
            split_loss = split(x[mine], y[mine])[1]
            split_loss.backward()
        with data:  # the data-parallel group's
            optimizer.reduce_gradients()
            optimizer.step()
        optimizer.zero_grad()
        mean = split_loss.detach().clone()
        dist.all_reduce(mean, group=data_group)  # the copies' losses, averaged: the batch's
        losses.append(mean.item() / dp)
        loss_error = max(loss_error, abs(losses[-1] - loss.item()))
    return TwoDRun(
        coordinate=where,
        losses=losses,
        loss=loss_error,
        weights=split_difference(model, split, grads=False),
        tensor_bytes=tensor.sent_bytes() / steps,
        data_bytes=data.sent_bytes() / steps,
        params=sum(p.numel() for p in split.parameters()),
        state=optimizer.state_elements(),
    )


# --8<-- [end:train]


# --8<-- [start:demo]
def demo(dp: int = 2, tp: int = 2) -> None:
    """dp x tp ranks, the tiny preset, 3 AdamW steps, 4 sequences per copy."""
    from tinyscale.comm.launch import run_on_ranks

    cfg = preset("tiny")
    runs = run_on_ranks(train_2d, dp * tp, dp, tp)
    for rank, r in enumerate(runs):
        print(f"rank {rank} (dp {r.coordinate['dp_replicate']}, tp {r.coordinate['tp']}): "
              f"{r.params:,} parameters, {r.state:,} optimizer-state elements, "
              f"sends {r.tensor_bytes:,.0f} B to its tensor group and "
              f"{r.data_bytes:,.0f} B to its data group per step")  # fmt: skip
    t = tensor_step_bytes(cfg, batch=4, seq_len=cfg.max_position_embeddings, tp=tp)
    d = zero_step_bytes(stage=1, numel=runs[0].params, world=dp)
    worst = max(max(r.loss, r.weights) for r in runs)
    print(f"formulas: {t:,.0f} B (tensor), {d:,.0f} B (data); "
          f"largest difference from one process {worst:.1e}")  # fmt: skip


# --8<-- [end:demo]
