# --8<-- [start:header]
"""The same split with PyTorch's DTensor: parallelize_module on the course model.

Try it:  python -c "from tinyscale.tensor_parallel.tp_dtensor import demo; demo()"

Once tp_model.py has built column- and row-parallel layers, PyTorch's own are fair
game. A plan names each module and its style; parallelize_module turns the module's
weights into DTensors (each rank holds a shard and knows the whole shape) and wraps its
inputs and outputs in the redistributions a style implies. ColwiseParallel is our
ColumnParallelLinear, RowwiseParallel our RowParallelLinear, SequenceParallel our norms
on 1/t of the positions, and loss_parallel our vocabulary-parallel cross-entropy.
"""

import copy

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from tinyscale.comm.parallel_layout import ParallelLayout
from tinyscale.core.config import ModelConfig, preset
from tinyscale.core.model import TinyTransformer, qkv_rows
from tinyscale.core.parity import largest_difference
from tinyscale.tensor_parallel.tp_model import check_tensor_parallel_size

# --8<-- [end:header]


# --8<-- [start:plan]
def heads_in_rank_order(cfg: ModelConfig, t: int) -> torch.Tensor:
    """qkv's rows reordered so that the r-th of t equal pieces holds rank r's heads.

    ColwiseParallel cuts a weight into contiguous pieces; the fused qkv weight stacks
    [q | k | v], so its first half is all of q. Reordered [q, k, v of heads 0..a/t-1 |
    q, k, v of the next a/t | ...], piece r is exactly what ``qkv_rows`` gives rank r.
    """
    per_rank = cfg.num_attention_heads // t
    return torch.cat([qkv_rows(cfg, range(r * per_rank, (r + 1) * per_rank)) for r in range(t)])


def block_plan(sequence_parallel: bool) -> dict:
    if not sequence_parallel:  # the inputs are replicated, the outputs all-reduced
        return {
            "attn.qkv": ColwiseParallel(),
            "attn.proj": RowwiseParallel(),
            "ffn.up": ColwiseParallel(),
            "ffn.down": RowwiseParallel(),
        }
    return {  # the norms on this rank's positions; all-gather in, reduce-scatter out
        "ln1": SequenceParallel(),
        "attn.qkv": ColwiseParallel(input_layouts=Shard(1)),
        "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
        "ln2": SequenceParallel(),
        "ffn.up": ColwiseParallel(input_layouts=Shard(1)),
        "ffn.down": RowwiseParallel(output_layouts=Shard(1)),
    }


def parallelize(model: TinyTransformer, mesh: DeviceMesh, *, sequence_parallel: bool) -> None:
    """Split ``model`` over the 1-D ``mesh``, in place."""
    cfg, t = model.cfg, mesh.size()
    check_tensor_parallel_size(cfg, t)
    order = heads_in_rank_order(cfg, t)
    for block in model.blocks:
        with torch.no_grad():  # same weights, rows in rank order
            block.attn.qkv.weight.copy_(block.attn.qkv.weight[order])
            block.attn.qkv.bias.copy_(block.attn.qkv.bias[order])
        parallelize_module(block, mesh, block_plan(sequence_parallel))
    sp = Shard(1) if sequence_parallel else Replicate()  # what enters the head
    top = {
        "tok_emb": RowwiseParallel(input_layouts=Replicate()),  # rows of the vocabulary
        "lm_head": ColwiseParallel(
            input_layouts=sp, output_layouts=Shard(-1), use_local_output=False
        ),
    }
    if sequence_parallel:  # split the embeddings' output by position before block 0
        top["blocks.0"] = PrepareModuleInput(
            input_layouts=Replicate(), desired_input_layouts=Shard(1), use_local_output=True
        )
        top["ln_f"] = SequenceParallel()
    parallelize_module(model, mesh, top)
    if cfg.tie_word_embeddings:  # each style made its own DTensor: tie them again
        model.lm_head.weight = model.tok_emb.weight


# --8<-- [end:plan]


# --8<-- [start:compare]
def count_block_collectives(model: TinyTransformer, sequence_parallel: bool) -> tuple[dict, dict]:
    """The collectives one parallelized block runs, forward and backward, by CommDebugMode."""
    cfg, t = model.cfg, dist.get_world_size()
    T = cfg.max_position_embeddings // (t if sequence_parallel else 1)
    x = torch.randn(4, T, cfg.hidden_size, requires_grad=True)
    counts = []
    for run in ("forward", "backward"):
        with CommDebugMode() as comm:
            if run == "forward":
                out = model.blocks[0](x)
            else:
                out.sum().backward()
        counts.append({str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()})
    model.zero_grad()
    return counts[0], counts[1]


def against_one_process(sequence_parallel: bool, steps: int = 3) -> dict:
    """The DTensor model and one process, trained side by side: losses and final weights."""
    cfg, t = preset("tiny"), dist.get_world_size()
    mesh = ParallelLayout(tp=t).build(device_type="cpu").mesh["tp"]  # one axis: every rank
    torch.manual_seed(0)
    model = TinyTransformer(cfg)
    split = copy.deepcopy(model)
    parallelize(split, mesh, sequence_parallel=sequence_parallel)
    forward, backward = count_block_collectives(split, sequence_parallel)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, split)]
    batches = torch.randint(0, cfg.vocab_size, (steps, 2, 4, cfg.max_position_embeddings))
    loss_error = 0.0
    for x, y in batches:
        loss = model(x, y)[1]
        loss.backward()
        with loss_parallel():  # cross-entropy on logits sharded by vocabulary
            split_loss = split(x, y)[1]
            split_loss.backward()
        loss_error = max(loss_error, abs(loss.item() - split_loss.full_tensor().item()))
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    order = heads_in_rank_order(cfg, t)
    weight_error = 0.0
    for name, param in split.named_parameters():
        full = param.full_tensor() if hasattr(param, "full_tensor") else param
        reference = model.get_parameter(name).detach()
        if name.endswith("attn.qkv.weight") or name.endswith("attn.qkv.bias"):
            reference = reference[order]
        weight_error = max(weight_error, largest_difference(full, reference))
    return {"loss": loss_error, "weights": weight_error, "forward": forward, "backward": backward}


# --8<-- [end:compare]


# --8<-- [start:demo]
def both() -> list[dict]:
    """On each rank: plain TP, then TP + SP (one launch for both)."""
    return [against_one_process(sp) for sp in (False, True)]


def demo(world_size: int = 2) -> None:
    from tinyscale.comm.launch import run_on_ranks

    ranks = run_on_ranks(both, world_size)
    for run, sp in enumerate((False, True)):
        facts = [rank[run] for rank in ranks]
        name = "DTensor TP + SP" if sp else "DTensor TP"
        worst = max(max(f["loss"], f["weights"]) for f in facts)
        print(f"{name}, t = {world_size}: largest difference from one process {worst:.1e}")
        print(f"  one block, forward {facts[0]['forward']}, backward {facts[0]['backward']}")


# --8<-- [end:demo]
