# --8<-- [start:header]
"""3D parallelism from the course's pieces: tensor parallel inside pipeline stages, ZeRO-1 across.

Try it:  python -c "from tinyscale.composed.three_d import demo; demo()"

The ranks form a pp x dp x tp grid (a ParallelLayout: pp outermost, tp innermost). Each
line of the grid along pp is one pipeline (pipeline_parallel.pipeline.Pipeline, 1F1B), in
global ranks. Each of its stages is split over the stage's tensor group as
TensorParallelTransformer splits a whole model: the blocks by heads and FFN channels, the
first stage's embedding and the last stage's head and loss by vocabulary. Tensor rank i
of stage s sends its activations to tensor rank i of stage s + 1, and receives their
gradients back: without sequence parallelism every rank of a tensor group holds the whole
activation, so each sends its own copy (Megatron-LM sends 1/t and all-gathers; the page
compares the two). The dp pipelines train on different parts of the batch: ShardedOptimizer
(ZeRO-1) averages their gradients and shards the Adam state over the data-parallel group.
"""

import copy
import dataclasses
import functools

import torch
import torch.distributed as dist
from torch import nn

from tinyscale.comm.comm_model import ring_allreduce_bytes
from tinyscale.comm.counter import CollectiveCounter
from tinyscale.comm.parallel_layout import ParallelLayout
from tinyscale.core.config import ModelConfig, preset
from tinyscale.core.errors import UsageError
from tinyscale.core.memory import activation_bytes
from tinyscale.core.model import ModelStage, TinyTransformer
from tinyscale.core.parity import largest_difference
from tinyscale.data_parallel.memory_calculator import (
    activation_bytes_estimate,
    zero_state_bytes,
    zero_step_bytes,
)
from tinyscale.data_parallel.sharded_optimizer import ShardedOptimizer
from tinyscale.pipeline_parallel.pipeline import Pipeline, PipelineConfig, split_layers
from tinyscale.tensor_parallel.tp_model import (
    ColumnParallelLinear,
    check_tensor_parallel_size,
    parallelize_block,
    shard,
)
from tinyscale.tensor_parallel.tp_ops import Group
from tinyscale.tensor_parallel.tp_parity import whole_part
from tinyscale.tensor_parallel.vocab_parallel import (
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)

LR = 1e-2  # AdamW's learning rate, as in the parity ladder

# --8<-- [end:header]


# --8<-- [start:stage]
def check_3d(
    cfg: ModelConfig, layout: ParallelLayout, *, world: int, batch: int, micro_batch: int
) -> None:
    """One line naming the fix, before any process waits on another."""
    layout.validate(world)
    split_layers(cfg.num_hidden_layers, layout.pp)  # at most one pipeline stage per block
    check_tensor_parallel_size(cfg, layout.tp)
    dp = layout.dp_replicate
    if batch % (dp * micro_batch):
        raise UsageError(
            f"a batch of {batch} does not split into {dp} data-parallel parts of whole "
            f"micro-batches of {micro_batch}: use a batch that dp x micro-batch divides"
        )


def tensor_parallel_stage(stage: ModelStage, *, group: Group) -> ModelStage:
    """Split a pipeline stage over its tensor group, in place: its blocks as
    TensorParallelTransformer splits them; its embedding, head and loss by vocabulary."""
    cfg, t, rank = stage.cfg, dist.get_world_size(group), dist.get_rank(group)
    rows = torch.arange(rank * cfg.vocab_size // t, (rank + 1) * cfg.vocab_size // t)
    for block in stage.blocks.values():
        parallelize_block(block, cfg, group=group, sequence_parallel=False)
    if stage.first:  # the same rows as the head's: a tied pair sums one (V/t, C) gradient
        stage.tok_emb = VocabParallelEmbedding(shard(stage.tok_emb.weight, 0, rows), group=group)
    if stage.last:
        tied_here = stage.first and cfg.tie_word_embeddings  # one stage: one parameter
        weight = stage.tok_emb.weight if tied_here else shard(stage.lm_head.weight, 0, rows)
        stage.lm_head = ColumnParallelLinear(weight, None, group=group, sequence_parallel=False)
    return stage


def tensor_parallel_pieces(cfg: ModelConfig, group: Group) -> dict:
    """Pipeline's ``split`` and ``loss`` for stages split over ``group``: the last stage's
    logits are (B/m, T, V/t), and the loss of all V comes from three small all-reduces."""
    start = dist.get_rank(group) * cfg.vocab_size // dist.get_world_size(group)  # my first token
    return {
        "split": functools.partial(tensor_parallel_stage, group=group),
        "loss": functools.partial(vocab_parallel_cross_entropy, vocab_start=start, group=group),
    }


# --8<-- [end:stage]


# --8<-- [start:formulas]
def stage_parameters(cfg: ModelConfig, layers: range, *, first: bool, last: bool, tp: int) -> int:
    """Parameters one rank of a pipeline stage holds (tp_model.parameters_per_rank,
    for the stage's blocks): a tied head on another stage is a second copy of V/t rows."""
    h, i, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    split = (3 * h * h + 3 * h) + h * h + (h * i + i) + i * h  # qkv, proj, up, down: / t
    whole = 2 * (2 * h) + h + h  # two LayerNorms, proj's and down's biases
    n = len(layers) * (split // tp + whole)
    if first:
        n += V * h // tp + cfg.max_position_embeddings * h  # token rows, positions
    if last:
        n += 2 * h + (0 if first and cfg.tie_word_embeddings else V * h // tp)  # ln_f, head
    return n


def stage_tensor_bytes(
    cfg: ModelConfig, layers: range, *, first: bool, last: bool, batch: int, seq_len: int,
    tp: int, element_size: int = 4,
) -> float:  # fmt: skip
    """two_d.tensor_step_bytes, for the stage's part of the model: 4 all-reduces of (B, T, C)
    per block, the embedding's on the first stage, the head's and the loss's on the last."""
    bsh, bs = batch * seq_len * cfg.hidden_size, batch * seq_len
    elements = (4 * len(layers) + first + last) * bsh + 3 * bs * last
    return ring_allreduce_bytes(size_bytes=element_size * elements, world_size=tp)


def pipeline_step_bytes(
    cfg: ModelConfig, *, first: bool, last: bool, batch: int, seq_len: int, element_size: int = 4
) -> float:
    """Bytes one rank sends to its pipeline neighbours per step: every micro-batch's
    activation forward (not from the last stage), its gradient back (not from the first).
    The m micro-batches of B/m sequences add up to the rank's batch B."""
    return (2 - first - last) * batch * seq_len * cfg.hidden_size * element_size


def tied_step_bytes(cfg: ModelConfig, *, tp: int, element_size: int = 4) -> float:
    """The tied embedding's gradient all-reduce, on the first and the last stage only:
    V/t rows of C in a group of 2 ranks, a ring sends 2 (2 - 1)/2 = 1 buffer."""
    grad = cfg.vocab_size // tp * cfg.hidden_size * element_size
    return ring_allreduce_bytes(size_bytes=grad, world_size=2)


# --8<-- [end:formulas]


# --8<-- [start:train]
class GroupCounter(CollectiveCounter):
    """A CollectiveCounter that also notes each call's group: the bytes sent per group."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: list[Group] = []

    def _log(self, op: str, tensor: torch.Tensor, group: Group) -> None:
        if self.counting:
            self.groups.append(group)
        super()._log(op, tensor, group)

    def sent_to(self, group: Group) -> float:
        """Bytes sent on ``group`` (None: point-to-point over global ranks)."""
        return sum(
            c.sent_bytes() for c, g in zip(self.calls, self.groups, strict=True) if g is group
        )


class StageLoss(nn.Module):
    """A stage and, on the last one, its loss: what one micro-batch's forward saves."""

    def __init__(self, pipe: Pipeline) -> None:
        super().__init__()
        self.stage, self.loss = pipe.stages[0], pipe.loss

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        out = self.stage(x)
        return self.loss(out, targets) if self.stage.last else out


@dataclasses.dataclass
class ThreeDRun:
    coordinate: dict[str, int]
    layers: range  # this rank's pipeline stage's blocks
    losses: list[float]  # the batch's mean loss, step by step
    loss: float  # the largest |loss - one process's loss| over the steps
    weights: float  # after the last step, against one process
    sent: dict[str, float]  # per step, to each group: tp, pp (point-to-point), tied, dp
    params: int  # parameters this rank holds
    state: int  # optimizer state elements this rank holds
    activations: int  # bytes one micro-batch's forward saves on this rank
    peak: int  # micro-batches whose activations this rank held at once


def train_3d(
    dp: int, pp: int, tp: int, steps: int = 3, batch: int = 8, micro_batch: int = 2
) -> ThreeDRun:
    """One process's training, and the same on a pp x dp x tp grid, on every rank."""
    layout, cfg = ParallelLayout(pp=pp, dp_replicate=dp, tp=tp), preset("tiny")
    check_3d(cfg, layout, world=dist.get_world_size(), batch=batch, micro_batch=micro_batch)
    built, where = layout.build(), layout.coordinate(dist.get_rank())
    groups = {"tp": built.group("tp"), "dp": built.group("dp_replicate")}
    torch.manual_seed(0)
    model = TinyTransformer(cfg)  # the reference: one process, the whole batch
    reference = torch.optim.AdamW(model.parameters(), lr=LR)
    T = cfg.max_position_embeddings
    batches = torch.randint(0, cfg.vocab_size, (steps, 2, batch, T))
    rows = batch // dp  # one pipeline's part of the batch
    mine = slice(where["dp_replicate"] * rows, (where["dp_replicate"] + 1) * rows)
    tensor = tensor_parallel_pieces(cfg, groups["tp"]) if tp > 1 else {}  # tp 1: plain stages
    pipe = Pipeline(copy.deepcopy(model), config=PipelineConfig(microbatches=rows // micro_batch),
                    batch_shape=(rows, T), layout=layout, **tensor)  # fmt: skip
    optimizer = ShardedOptimizer(pipe.parameters(), torch.optim.AdamW, group=groups["dp"], lr=LR)
    counter, losses, loss_error = GroupCounter(), [], 0.0
    for x, y in batches:
        loss = model(x, y)[1]
        loss.backward()
        reference.step()
        reference.zero_grad()
        with counter:  # the pipeline's step, then ZeRO-1 over the data-parallel group
            mine_loss = torch.tensor(pipe.step(x[mine], y[mine]) or 0.0)  # on the last stage
            optimizer.reduce_gradients()
            optimizer.step()
        optimizer.zero_grad()
        dist.all_reduce(mine_loss)  # dp x tp last-stage ranks hold their pipeline's loss
        losses.append(mine_loss.item() / (dp * tp))
        loss_error = max(loss_error, abs(losses[-1] - loss.item()))
    whole = dict(model.named_parameters(remove_duplicate=False))
    to = {"tp": groups["tp"], "pp": None, "dp": groups["dp"]}  # None: point-to-point
    to["tied"] = getattr(pipe, "tied_group", "none")  # the first and last stages only
    x = ids = torch.randint(0, cfg.vocab_size, (micro_batch, T))  # one micro-batch, measured
    if not pipe.stages[0].first:  # token ids into the first stage, an activation into others
        x = torch.randn(micro_batch, T, cfg.hidden_size, requires_grad=True)
    return ThreeDRun(
        coordinate={"pp": where["pp"], "dp": where["dp_replicate"], "tp": where["tp"]},
        layers=pipe.stages[0].layers,
        losses=losses,
        loss=loss_error,
        weights=max(
            largest_difference(p, whole_part(whole[n], p))
            for n, p in pipe.named_parameters().items()
        ),
        sent={name: counter.sent_to(group) / steps for name, group in to.items()},
        params=sum(p.numel() for p in pipe.parameters()),
        state=optimizer.state_elements(),
        activations=activation_bytes(StageLoss(pipe), x, ids),
        peak=pipe.activations.peak,
    )


# --8<-- [end:train]


# --8<-- [start:demo]
SHAPES = ((1, 2, 2), (2, 2, 1), (2, 2, 2))  # (dp, pp, tp): 4, 4 and 8 ranks


def formulas(
    cfg: ModelConfig, layout: ParallelLayout, stage: int, *, batch: int
) -> dict[str, float]:
    """What a rank of pipeline stage ``stage`` holds and sends per step, on paper."""
    layers = split_layers(cfg.num_hidden_layers, layout.pp)[stage]
    ends = {"first": stage == 0, "last": stage == layout.pp - 1}
    tied = cfg.tie_word_embeddings and layout.pp > 1 and (ends["first"] or ends["last"])
    params = stage_parameters(cfg, layers, **ends, tp=layout.tp)
    rows, T = batch // layout.dp_replicate, cfg.max_position_embeddings  # one pipeline's sequences
    return {
        "params": params,
        "Adam": zero_state_bytes(params, stage=1, world_size=layout.dp_replicate).optimizer
        / 4,  # elements
        "tp": stage_tensor_bytes(cfg, layers, **ends, batch=rows, seq_len=T, tp=layout.tp),
        "pp": pipeline_step_bytes(cfg, **ends, batch=rows, seq_len=T),
        "tied": tied_step_bytes(cfg, tp=layout.tp) if tied else 0.0,
        "dp": zero_step_bytes(stage=1, numel=params, world=layout.dp_replicate),
    }


def demo(batch: int = 8, micro_batch: int = 2) -> None:
    """Three grids, the tiny preset, 3 AdamW steps of 8 sequences in micro-batches of 2."""
    from tinyscale.comm.launch import run_on_ranks

    cfg = preset("tiny")
    print(f"rank  (pp, dp, tp)  block  params    Adam  activations  "
          f"{'tp B':>7} {'pp B':>7} {'tied B':>7} {'dp B':>7}")  # fmt: skip
    for dp, pp, tp in SHAPES:
        layout = ParallelLayout(pp=pp, dp_replicate=dp, tp=tp)
        runs = run_on_ranks(train_3d, layout.world_size, dp, pp, tp, 3, batch, micro_batch)
        print(f"dp {dp} x pp {pp} x tp {tp}: loss {'  '.join(f'{x:.6f}' for x in runs[0].losses)}"
              f", largest difference from one process {max(r.loss for r in runs):.1e}")  # fmt: skip
        for rank, r in enumerate(runs):
            s, blocks = r.sent, ",".join(map(str, r.layers))
            print(f"{rank:>4}  {tuple(r.coordinate.values())!s:<12}  {blocks:>5}  {r.params:>6,}  "
                  f"{r.state:>6,}  {r.activations:>6,} x {r.peak}  {s['tp']:>7,.0f} "
                  f"{s['pp']:>7,.0f} {s['tied']:>7,.0f} {s['dp']:>7,.0f}")  # fmt: skip
        for stage in range(pp):
            f = formulas(cfg, layout, stage, batch=batch)
            print(f"{f'   formulas, stage {stage}':<25}  {f['params']:>6,}  {f['Adam']:>6,.0f}  "
                  f"{'':>11}  {f['tp']:>7,.0f} {f['pp']:>7,.0f} {f['tied']:>7,.0f} "
                  f"{f['dp']:>7,.0f}")  # fmt: skip
        first = [r for r in runs if r.coordinate["dp"] == r.coordinate["tp"] == 0]
        total = sum(r.activations for r in first)  # one rank per stage: copy 0, tp rank 0
        calculator = activation_bytes_estimate(cfg, micro_batch=micro_batch,
                                               seq_len=cfg.max_position_embeddings,
                                               tensor_parallel=tp)  # fmt: skip
        print(
            f"   one micro-batch's activations, all stages: {total:,} B, calculator "
            f"{calculator:,} B; weights after 3 steps within {max(r.weights for r in runs):.0e}"
        )


# --8<-- [end:demo]
