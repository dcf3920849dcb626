# --8<-- [start:header]
"""Tensor parallelism proven and measured: one process's numbers, and the collectives counted.

Try it:  python -c "from tinyscale.tensor_parallel.tp_parity import demo; demo()"

On every rank the whole model is built from one seed (the reference, one process's
computation) and a copy of it is split with TensorParallelTransformer. Both train on the
same batches with AdamW; each split parameter is compared with the same entries of the
whole one (``tp_dim``, ``tp_index``), each replicated parameter with the whole one.
"""

import copy
import dataclasses

import torch
import torch.distributed as dist
from torch import nn

from tinyscale.comm.counter import CollectiveCounter
from tinyscale.core.config import ModelConfig, preset
from tinyscale.core.memory import activation_bytes
from tinyscale.core.model import TinyTransformer
from tinyscale.core.parity import largest_difference
from tinyscale.tensor_parallel.tp_model import TensorParallelTransformer

# --8<-- [end:header]


# --8<-- [start:compare]
def whole_part(whole: torch.Tensor, part: nn.Parameter) -> torch.Tensor:
    """The entries of the unsplit tensor that this rank's ``part`` holds."""
    if not hasattr(part, "tp_index"):
        return whole  # replicated: every rank holds all of it
    return whole.index_select(part.tp_dim, part.tp_index)


def split_difference(model: nn.Module, split: nn.Module, *, grads: bool) -> float:
    """The largest |split - whole| over every parameter (or gradient) this rank holds."""
    whole = dict(model.named_parameters())
    worst = 0.0
    for name, part in split.named_parameters():
        ours, reference = (part.grad, whole[name].grad) if grads else (part, whole[name])
        worst = max(worst, largest_difference(ours, whole_part(reference, part)))
    return worst


# --8<-- [end:compare]


# --8<-- [start:parity]
@dataclasses.dataclass
class Parity:
    loss: float  # the largest |loss difference| over the steps
    logits: float  # first step, this rank's vocabulary slice
    grads: float  # first step, every parameter this rank holds
    weights: float  # after the last step
    params: int  # parameters this rank holds


def parity(
    *, sequence_parallel: bool = False, steps: int = 3, cfg: ModelConfig | None = None
) -> Parity:
    """Train the whole model and its split copy side by side; return the differences."""
    cfg = cfg or preset("tiny")  # dropout 0: no random masks to keep in step across ranks
    torch.manual_seed(0)
    model = TinyTransformer(cfg)
    split = TensorParallelTransformer(copy.deepcopy(model), sequence_parallel=sequence_parallel)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, split)]
    batches = torch.randint(0, cfg.vocab_size, (steps, 2, 4, cfg.max_position_embeddings))
    loss_error = logit_error = grad_error = 0.0
    for step, (x, y) in enumerate(batches):  # the same inputs and targets on every rank
        logits, loss = model(x, y)
        split_logits, split_loss = split(x, y)
        loss.backward()
        split_loss.backward()
        if sequence_parallel:
            split.sync_sequence_parallel_grads()
        loss_error = max(loss_error, abs(loss.item() - split_loss.item()))
        if step == 0:
            mine = split.tok_emb.rows  # this rank's slice of the vocabulary
            logit_error = largest_difference(split_logits, logits[..., mine])
            grad_error = split_difference(model, split, grads=True)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    return Parity(
        loss=loss_error,
        logits=logit_error,
        grads=grad_error,
        weights=split_difference(model, split, grads=False),
        params=sum(p.numel() for p in split.parameters()),
    )


# --8<-- [end:parity]


# --8<-- [start:count]
@dataclasses.dataclass
class BlockTraffic:
    forward: dict[str, int]  # collective -> calls, in one block's forward
    backward: dict[str, int]
    sent_bytes: float  # by this rank, forward and backward, with ring algorithms
    activation: int  # bytes of one (B, T, C) activation, fp32


def count_block(
    *, sequence_parallel: bool, batch: int = 4, cfg: ModelConfig | None = None
) -> BlockTraffic:
    """The collectives one transformer block runs, forward then backward."""
    cfg = cfg or preset("tiny")
    torch.manual_seed(0)
    split = TensorParallelTransformer(TinyTransformer(cfg), sequence_parallel=sequence_parallel)
    block, t = split.blocks[0], dist.get_world_size()
    T = cfg.max_position_embeddings // t if sequence_parallel else cfg.max_position_embeddings
    x = torch.randn(batch, T, cfg.hidden_size, requires_grad=True)  # what enters the block
    with CollectiveCounter() as counter:
        out = block(x)
        forward, forward_sent = dict(counter.ops()), counter.sent_bytes()
        counter.clear()
        out.sum().backward()
    return BlockTraffic(
        forward=forward,
        backward=dict(counter.ops()),
        sent_bytes=forward_sent + counter.sent_bytes(),
        activation=batch * cfg.max_position_embeddings * cfg.hidden_size * 4,
    )


def saved_activations(
    *, sequence_parallel: bool, batch: int = 4, cfg: ModelConfig | None = None
) -> int:
    """Bytes this rank's forward saves for backward (the loss included), measured."""
    cfg = cfg or preset("tiny")
    split = TensorParallelTransformer(TinyTransformer(cfg), sequence_parallel=sequence_parallel)
    ids = torch.randint(0, cfg.vocab_size, (batch, cfg.max_position_embeddings))
    return activation_bytes(split, ids, ids)


# --8<-- [end:count]


# --8<-- [start:demo]
def report() -> list[dict]:
    """On each rank: plain TP, then TP + SP (one launch for both)."""
    return [
        {
            "parity": parity(sequence_parallel=sp),
            "block": count_block(sequence_parallel=sp),
            "activations": saved_activations(sequence_parallel=sp),
        }
        for sp in (False, True)
    ]


def demo(world_size: int = 2) -> None:
    """t = world_size, the tiny preset, 3 AdamW steps: plain TP, then with SP."""
    from tinyscale.comm.launch import run_on_ranks

    ranks = run_on_ranks(report, world_size)
    for run, sp in enumerate((False, True)):
        facts = [rank[run] for rank in ranks]
        p, b = facts[0]["parity"], facts[0]["block"]
        worst = {key: max(getattr(f["parity"], key) for f in facts)
                 for key in ("loss", "logits", "grads", "weights")}  # fmt: skip
        print(f"{'TP + SP' if sp else 'TP'}, t = {world_size}, on rank 0: {p.params:,} parameters, "
              f"{facts[0]['activations']:,} bytes of saved activations")  # fmt: skip
        print("  largest difference from one process: "
              f"loss {worst['loss']:.1e}, logits {worst['logits']:.1e}, "
              f"gradients {worst['grads']:.1e}, weights after 3 steps {worst['weights']:.1e}")  # fmt: skip
        print(f"  one block: forward {b.forward}, backward {b.backward}")
        print(f"  sent per rank {b.sent_bytes:,.0f} bytes = "
              f"{b.sent_bytes / b.activation:.2f} x the {b.activation:,}-byte activation")  # fmt: skip


# --8<-- [end:demo]


# --8<-- [start:exercise]
def norm_gradients() -> list[tuple[float, float]]:
    """Exercise 2, on each rank: how far its gradient of the first LayerNorm's weight is from
    one process's after one backward pass, before and after ``sync_sequence_parallel_grads``
    (it sums nothing without sequence parallelism): for plain TP, then for TP + SP."""
    cfg = preset("tiny")
    found = []
    for sp in (False, True):
        torch.manual_seed(0)
        model = TinyTransformer(cfg)
        split = TensorParallelTransformer(copy.deepcopy(model), sequence_parallel=sp)
        ids = torch.randint(0, cfg.vocab_size, (4, cfg.max_position_embeddings))
        model(ids, ids)[1].backward()
        split(ids, ids)[1].backward()
        whole = model.blocks[0].ln1.weight.grad
        before = largest_difference(split.blocks[0].ln1.weight.grad, whole)
        split.sync_sequence_parallel_grads()
        found.append((before, largest_difference(split.blocks[0].ln1.weight.grad, whole)))
    return found


# --8<-- [end:exercise]
