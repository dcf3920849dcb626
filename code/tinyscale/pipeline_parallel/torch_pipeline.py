# --8<-- [start:header]
"""Our pipeline stages through torch.distributed.pipelining, proven equal to one process.

    python -m tinyscale.pipeline_parallel.torch_pipeline                  # 4 schedules, p = 2
    python -m tinyscale.pipeline_parallel.torch_pipeline --world-size 4   # the same at p = 4

The from-scratch lesson (tinyscale.pipeline_parallel.pipeline) moved activations with
send/recv and ordered forwards and backwards by hand. PyTorch's version keeps the same
three pieces: a ``PipelineStage`` wraps one of our ``ModelStage``s and owns its sends and
receives; a schedule (GPipe, 1F1B, interleaved 1F1B, zero-bubble V) orders the micro-
batches; the loss function is ``TinyTransformer.loss``. The stages are ours, cut by
``cut_into_stages``, so one step must give the gradients of one process on the same batch.
"""

import functools
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble,
)
from torch.distributed.tensor import DTensor

from tinyscale.comm.parallel_layout import job_timeout, new_subgroup
from tinyscale.core.config import preset
from tinyscale.core.errors import UsageError, run_cli
from tinyscale.core.model import ModelStage, TinyTransformer, cut_into_stages
from tinyscale.core.parity import largest_difference
from tinyscale.pipeline_parallel.pipeline import split_layers

# --8<-- [end:header]


# --8<-- [start:placement]
SCHEDULES = {  # name on the command line -> (torch class, pipeline stages per rank)
    "gpipe": (ScheduleGPipe, 1),
    "1f1b": (Schedule1F1B, 1),
    "interleaved": (ScheduleInterleaved1F1B, 2),
    "zbv": (ScheduleZBVZeroBubble, 2),
}


def check_schedule(name: str) -> tuple[type, int]:
    """The torch schedule class and stages per rank of ``name``; a one-line error otherwise."""
    if name not in SCHEDULES:
        raise UsageError(f"--schedule {name!r} is not known: use one of {', '.join(SCHEDULES)}")
    return SCHEDULES[name]


def stage_placement(schedule: str, *, rank: int, pp: int) -> list[int]:
    """The pipeline stages rank ``rank`` of ``pp`` runs, in the order torch wants them.

    Loop (GPipe, 1F1B, interleaved): rank r runs stages r, r + pp, r + 2 pp, ...
    V (ZBV): rank r runs stage r on the way down and 2 pp - 1 - r on the way back up, so
    rank 0 holds the first *and* the last stage: the embedding and the head meet again.
    """
    _, per_rank = check_schedule(schedule)
    if schedule == "zbv":
        return [rank, 2 * pp - 1 - rank]
    return [rank + k * pp for k in range(per_rank)]


# --8<-- [end:placement]


# --8<-- [start:build]
def microbatch_loss(
    logits: torch.Tensor, targets: torch.Tensor, *, microbatches: int
) -> torch.Tensor:
    """One micro-batch's share of the batch's mean loss: TinyTransformer.loss / microbatches."""
    return TinyTransformer.loss(logits, targets) / microbatches


def build_schedule(
    model: TinyTransformer, *, schedule: str, microbatches: int, group: dist.ProcessGroup,
    device: torch.device,
) -> tuple[Any, list[ModelStage]]:  # fmt: skip
    """Cut ``model`` into pp x (stages per rank) stages; wrap this rank's in PipelineStages.

    ``group`` is the pipeline's process group (all ranks, or one row of a 2-D mesh); the
    stage index is a place in the pipeline, so ranks are counted inside ``group``.
    Returns the schedule, whose ``step`` runs one batch, and this rank's ``ModelStage``s.
    """
    cls, per_rank = check_schedule(schedule)
    pp, rank = group.size(), group.rank()
    num_stages = pp * per_rank
    stages = cut_into_stages(model, split_layers(model.cfg.num_hidden_layers, num_stages))
    mine = [stages[i] for i in stage_placement(schedule, rank=rank, pp=pp)]
    wrapped = [
        PipelineStage(stage, i, num_stages, device, group=group)  # sends and receives for it
        for i, stage in zip(stage_placement(schedule, rank=rank, pp=pp), mine, strict=True)
    ]
    # The loss is the model's own, divided by the number of micro-batches: their sum is
    # then the mean over the whole batch, and so are the gradients, as one process gets
    # them. torch would rather divide each stage's gradients after the step
    # (scale_grads=True), but a V rank holds the tied matrix in two stages: divided twice.
    kwargs = {
        "n_microbatches": microbatches,
        "loss_fn": functools.partial(microbatch_loss, microbatches=microbatches),
        "scale_grads": False,
    }
    runner = cls(wrapped[0], **kwargs) if per_rank == 1 else cls(wrapped, **kwargs)
    return runner, mine


# --8<-- [end:build]


# --8<-- [start:tied]
def last_stage_rank(schedule: str, pp: int) -> int:
    """Where the head and the loss live: the last rank of a loop, rank 0 of a V."""
    return 0 if schedule == "zbv" else pp - 1


def tied_embedding_group(pipelines: Sequence[Sequence[int]], last: int) -> Any:
    """One process group per pipeline joining its first and its last stage's ranks.

    ``pipelines`` lists every pipeline's global ranks, in stage order; every rank calls
    this with the same list (creating a group is collective). Returns this rank's group,
    or None where no all-reduce is needed: a rank between them, or a V whose first and
    last stage share rank 0 (then autograd sums the two gradients in the one Parameter).
    """
    if last == 0:
        return None
    pairs = [[ranks[0], ranks[last]] for ranks in pipelines]
    return new_subgroup(pairs, job_timeout())  # with the job's timeout, as every group


def sync_tied_embedding(model: TinyTransformer, group: Any) -> None:
    """Sum the embedding's gradient (first stage) and the head's (last stage), on both.

    The two ranks hold one ``tok_emb.weight`` each (the same matrix, tied); one process
    would add the two gradients in one tensor. After this both hold the sum, and two
    identical AdamW steps keep the copies equal.
    """
    if group is None or not model.cfg.tie_word_embeddings:  # untied: each rank owns its own
        return
    dist.all_reduce(model.tok_emb.weight.grad, group=group)


# --8<-- [end:tied]


# --8<-- [start:clip]
def held_parameters(stages: Sequence[ModelStage]) -> list[nn.Parameter]:
    """This rank's parameters, each once (a V rank holds the tied matrix in two stages)."""
    seen: dict[int, nn.Parameter] = {}
    for stage in stages:
        for p in stage.parameters():
            seen.setdefault(id(p), p)
    return list(seen.values())


def clip_grad_norm(
    stages: Sequence[ModelStage], max_norm: float, *, group: dist.ProcessGroup,
    tied_copy: bool = False,
) -> float:  # fmt: skip
    """clip_grad_norm_ over the whole pipeline: the norm of every stage's gradients together.

    Each rank only sees its stages, so it sums its squares and all-reduces the sums over
    the pipeline. ``tied_copy``: this rank's tied matrix is the second copy (the last
    stage's, after sync_tied_embedding): leave it out of the sum, count it once.
    """
    params = held_parameters(stages)
    tied = (
        {id(stages[-1].lm_head.weight)}
        if tied_copy and stages[-1].cfg.tie_word_embeddings
        else set()
    )
    squares = sum(
        (p.grad.double().pow(2).sum() for p in params if p.grad is not None and id(p) not in tied),
        start=torch.zeros((), dtype=torch.float64, device=params[0].device),
    )
    dist.all_reduce(squares, group=group)  # the sum over every stage of the pipeline
    norm = squares.sqrt().item()
    scale = min(1.0, max_norm / (norm + 1e-6))  # torch's formula: shrink only, never grow
    for p in params:
        if p.grad is not None:
            p.grad.mul_(scale)
    return norm


# --8<-- [end:clip]


# --8<-- [start:clip_sharded]
def clip_sharded_grad_norm(
    stage: ModelStage, max_norm: float, *, group: dist.ProcessGroup | None,
    tied_copy: bool = False,
) -> float:  # fmt: skip
    """clip_grad_norm over one stage whose parameters may be DTensors, and every stage.

    A DTensor's norm is that of the whole tensor, made whole by ``full_tensor()`` (a
    collective over its mesh: tensor-parallel and FSDP shards). The stages' squares are
    summed over the pipeline ``group`` (None: one stage). ``tied_copy``: this stage's head
    is the tied matrix the first stage counts: leave it out.
    """
    squares = torch.zeros((), device=next(stage.parameters()).device)
    for name, p in stage.named_parameters():
        if tied_copy and name == "lm_head.weight" and stage.cfg.tie_word_embeddings:
            continue  # stage 0 counts it
        norm = torch.linalg.vector_norm(p.grad)
        squares += (norm.full_tensor() if isinstance(norm, DTensor) else norm) ** 2
    if group is not None:
        dist.all_reduce(squares, group=group)
    total = squares.sqrt().item()
    scale = min(1.0, max_norm / (total + 1e-6))  # torch's formula: shrink only, never grow
    for p in stage.parameters():
        p.grad.mul_(scale)
    return total


# --8<-- [end:clip_sharded]


# --8<-- [start:compare]
def compare_schedules(
    schedules: Sequence[str], microbatches: int = 4, *, batch_size: int = 8, seed: int = 0,
    num_layers: int = 8, tied: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """On every rank of a pipeline of all ranks: one step of each schedule, against one process.

    Every rank builds the same model (same seed) and first runs the whole batch through
    it alone: the reference gradients. Then, for each schedule, a fresh pipeline of the
    same weights runs the same batch; each rank compares the gradients of the parameters
    it holds. Returns, per schedule, the largest difference over all ranks and the loss.
    ``tied=False`` unties the embedding and the head: nothing to sync, both in the norm.
    """
    rank, pp = dist.get_rank(), dist.get_world_size()
    pipeline = list(range(pp))
    torch.manual_seed(seed)
    model = TinyTransformer(preset("tiny", num_hidden_layers=num_layers, tie_word_embeddings=tied))
    x = torch.randint(0, model.cfg.vocab_size, (batch_size, model.cfg.max_position_embeddings))
    y = torch.roll(x, -1, dims=1)  # (B, T): any fixed targets will do
    _, loss = model(x, y)
    loss.backward()
    reference = {name: p.grad.clone() for name, p in model.named_parameters()}
    norm = nn.utils.clip_grad_norm_(model.parameters(), float("inf"))  # only measures
    report: dict[str, Any] = {
        "reference_loss": loss.item(),
        "reference_norm": norm.item(),
        "pp": pp,
    }
    for name in schedules:
        model.zero_grad(set_to_none=True)
        runner, mine = build_schedule(
            model, schedule=name, microbatches=microbatches, group=dist.group.WORLD,
            device=torch.device("cpu"),
        )  # fmt: skip
        losses: list[torch.Tensor] = []
        if 0 in stage_placement(name, rank=rank, pp=pp):  # the first stage takes the input
            runner.step(x, target=y, losses=losses)
        else:
            runner.step(target=y, losses=losses)
        last = last_stage_rank(name, pp)
        sync_tied_embedding(model, tied_embedding_group([pipeline], last))
        held = {id(p) for p in held_parameters(mine)}
        diff = max(
            largest_difference(p.grad, reference[n])
            for n, p in model.named_parameters()
            if id(p) in held
        )
        norm = clip_grad_norm(
            mine, float("inf"), group=dist.group.WORLD, tied_copy=rank == last != 0
        )
        worst = torch.tensor(diff)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # the largest over every rank
        mean = torch.stack(losses).sum() if losses else torch.zeros(())  # shares of the mean
        dist.broadcast(mean, src=last)  # the loss is known on the last stage's rank only
        report[name] = {
            "max_grad_diff": worst.item(), "loss": mean.item(), "last_rank": last, "norm": norm,
        }  # fmt: skip
    return report


# --8<-- [end:compare]


# --8<-- [start:cli]
def grad_diff(value: float) -> str:
    """A difference as the table prints it: rounding noise below 1e-6 reads the same."""
    return "< 1e-6" if value < 1e-6 else f"{value:.1e}"


def main(argv: Sequence[str] | None = None) -> int:
    from tinyscale.comm.launch import run_on_ranks
    from tinyscale.core.errors import ArgumentParser

    parser = ArgumentParser(description="torch.distributed.pipelining against one process.")
    parser.add_argument("--world-size", type=int, default=2, help="ranks = pipeline depth p")
    parser.add_argument("--microbatches", type=int, default=4)
    args = parser.parse_args(argv)
    if args.world_size < 2:
        raise UsageError(f"--world-size must be at least 2 for a pipeline, got {args.world_size}")
    if args.microbatches < 1 or 8 % args.microbatches:
        raise UsageError(f"--microbatches {args.microbatches} does not divide the batch of 8")
    split_layers(8, 2 * args.world_size)  # the model's 8 blocks must cover every stage
    r = run_on_ranks(compare_schedules, args.world_size, list(SCHEDULES),
                     args.microbatches, deadline_s=240)[0]  # fmt: skip
    print(f"p = {r['pp']} ranks, {args.microbatches} micro-batches of {8 // args.microbatches}; "
          f"one process: loss {r['reference_loss']:.4f}, "
          f"grad norm {r['reference_norm']:.4f}")  # fmt: skip
    print(f"{'schedule':<12} {'stages':>6} {'loss on':>8} {'loss':>7} {'grad norm':>9}  "
          "max |grad - one process|")  # fmt: skip
    for name, (_, per_rank) in SCHEDULES.items():
        s = r[name]
        print(f"{name:<12} {per_rank * r['pp']:>6} {'rank ' + str(s['last_rank']):>8} "
              f"{s['loss']:>7.4f} {s['norm']:>9.4f}  {grad_diff(s['max_grad_diff'])}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))

# --8<-- [end:cli]
