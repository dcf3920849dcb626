# --8<-- [start:header]
"""The parity ladder: one model, one set of batches, every kind of parallelism, one loss curve.

Try it:  python -c "from tinyscale.composed.ladder import demo; demo()"

Each rung trains the tiny preset for the same 3 AdamW steps on the same 8 sequences per
step, from the same initial weights, on 2 ranks (4 for 2D), and reports the batch's mean
loss at each step. If a rung splits anything wrongly (a gradient not averaged, a shard
not summed, a micro-batch lost), its curve leaves the one-process curve at once.
"""

import torch
import torch.distributed as dist
from torch import nn

from tinyscale.comm.launch import run_on_ranks
from tinyscale.composed.two_d import train_2d
from tinyscale.context_parallel.cp_model import ContextParallelTransformer, sum_gradients
from tinyscale.context_parallel.load_balance import SequenceSplit
from tinyscale.core.config import preset
from tinyscale.core.model import TinyTransformer
from tinyscale.core.step import train_step
from tinyscale.data_parallel.zero import ZeRO
from tinyscale.pipeline_parallel.pipeline import Pipeline, PipelineConfig
from tinyscale.tensor_parallel.tp_model import TensorParallelTransformer

STEPS, BATCH, LR = 3, 8, 1e-2
RUNGS = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "FSDP2", "TP", "TP + SP", "PP 1F1B", "CP ring")

# --8<-- [end:header]


# --8<-- [start:rungs]
def start() -> tuple[TinyTransformer, torch.Tensor]:
    """The same initial weights and batches on every rank, for every rung."""
    cfg = preset("tiny")
    torch.manual_seed(0)
    model = TinyTransformer(cfg)
    return model, torch.randint(0, cfg.vocab_size, (STEPS, 2, BATCH, cfg.max_position_embeddings))


def mean_over_ranks(loss: float) -> float:
    """Each data-parallel rank saw an equal share of the batch: the batch's loss is the mean."""
    t = torch.tensor(loss)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def one_process() -> list[float]:
    model, batches = start()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    steps = [train_step(loss_fn=lambda x, y: model(x, y)[1], micro_batches=[batch],
                        optimizer=optimizer, lr=LR) for batch in batches]  # fmt: skip
    return [s.loss for s in steps]


def rung(name: str, sync_norms: bool = True) -> list[float]:
    """This rank's view of one rung: the batch's loss at each step. ``sync_norms=False``
    leaves out the sum of the sequence-parallel gradients (Exercise 3 breaks a rung)."""
    model, batches = start()
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = slice(rank * BATCH // world, (rank + 1) * BATCH // world)  # a data-parallel share
    step: nn.Module | ZeRO | Pipeline | ContextParallelTransformer
    if name == "DDP":
        step = nn.parallel.DistributedDataParallel(model)
    elif name.startswith("ZeRO-"):
        step = ZeRO(model, stage=int(name[-1]), units=list(model.blocks), lr=LR)
    elif name == "FSDP2":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        step = fully_shard(model)
    elif name.startswith("TP"):
        step = TensorParallelTransformer(model, sequence_parallel=name == "TP + SP")
    elif name == "CP ring":  # each rank a head and a tail of every sequence's positions
        step = ContextParallelTransformer(model, split=SequenceSplit(world, "headtail"))
    else:
        step = Pipeline(model, config=PipelineConfig(schedule="1f1b", microbatches=4),
                        batch_shape=(BATCH, model.cfg.max_position_embeddings))  # fmt: skip
    params = step.parameters() if isinstance(step, Pipeline) else list(step.parameters())
    optimizer = None if isinstance(step, ZeRO) else torch.optim.AdamW(params, lr=LR)
    losses = []
    for x, y in batches:
        if isinstance(step, Pipeline):  # the whole batch, in micro-batches; the last stage's loss
            last = torch.tensor(step.step(x, y) or 0.0)
            dist.broadcast(last, src=world - 1)
            losses.append(last.item())
        elif isinstance(step, ContextParallelTransformer):  # this rank's positions of all
            share = step(step.split.shard(x, rank), step.split.shard(y, rank))[1]
            share.backward()
            sum_gradients(step)  # each rank's gradients cover its positions: add them up
            whole = share.detach().clone()
            dist.all_reduce(whole)  # the shares add up to the batch's mean loss
            losses.append(whole.item())
        elif isinstance(step, TensorParallelTransformer):  # the whole batch on every rank
            loss = step(x, y)[1]
            loss.backward()
            if step.sequence_parallel and sync_norms:
                step.sync_sequence_parallel_grads()
            losses.append(loss.item())
        else:  # data parallel: this rank's share
            loss = step(x[mine], y[mine])[1]
            loss.backward()
            losses.append(mean_over_ranks(loss.item()))
        if optimizer is None:
            step.step()
            step.zero_grad()
        else:
            optimizer.step()
            optimizer.zero_grad()
    return losses


def every_rung() -> dict[str, list[float]]:
    return {name: rung(name) for name in RUNGS}


# --8<-- [end:rungs]


# --8<-- [start:demo]
def ladder() -> list[tuple[str, int, list[float], float]]:
    """(rung, ranks, losses, largest |loss - one process's|), one process first."""
    reference = one_process()
    rows = [("one process", 1, reference, 0.0)]
    found = run_on_ranks(every_rung, 2)
    for name in RUNGS:
        curves = [rank[name] for rank in found]  # every rank must report the same curve
        worst = max(abs(a - b) for curve in curves for a, b in zip(curve, reference, strict=True))
        rows.append((name, 2, curves[0], worst))
    two_d = run_on_ranks(train_2d, 4, 2, 2)
    worst = max(abs(a - b) for r in two_d for a, b in zip(r.losses, reference, strict=True))
    rows.append(("2D: TP 2 x ZeRO-1 2", 4, two_d[0].losses, worst))
    return rows


def demo() -> None:
    print(f"{'rung':<20} ranks  {'loss, steps 1-3':<26} largest difference")
    for name, ranks, losses, worst in ladder():
        curve = "  ".join(f"{x:.6f}" for x in losses)
        print(f"{name:<20} {ranks:>5}  {curve}  {worst:.1e}")


# --8<-- [end:demo]
