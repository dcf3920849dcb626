# --8<-- [start:tp]
"""Tensor and sequence parallelism with DTensor on one pipeline stage, in any composition.

Launch:  torchrun --standalone --nproc-per-node 4 code/scripts/parallel_train.py --pp 2 --tp 2

A pipeline stage (``core.model.ModelStage``) holds some blocks of the model under the
model's names, with the embedding on the first stage and the head on the last. Its blocks
take Week 4's plan (``tp_dtensor.block_plan``) with sequence parallelism; the embedding
and the head are split by vocabulary rows. The fused qkv rows are kept in rank order, so
``in_model_order`` gives a checkpoint the model's own order back. With several stages, the
tied embedding's two gradients, DTensors or not, are summed by ``sum_tied_gradients``.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from tinyscale.core.config import ModelConfig
from tinyscale.core.model import ModelStage
from tinyscale.tensor_parallel.tp_dtensor import block_plan, heads_in_rank_order


def parallelize_stage(stage: ModelStage, mesh: DeviceMesh) -> None:
    """Tensor + sequence parallelism on one pipeline stage, over the 1-D ``mesh``.

    The blocks take Week 4's plan (tp_dtensor.block_plan): activations between blocks,
    and between stages, are cut by position (Shard(1)), so a stage sends 1/t of them.
    The embedding is cut by vocabulary rows; the head gathers the logits (Replicate), so
    the loss and the pipeline's loss function stay those of one process.
    """
    order = heads_in_rank_order(stage.cfg, mesh.size())
    for block in stage.blocks.values():
        with torch.no_grad():  # the fused qkv rows in rank order (see in_model_order)
            block.attn.qkv.weight.copy_(block.attn.qkv.weight[order])
            block.attn.qkv.bias.copy_(block.attn.qkv.bias[order])
        parallelize_module(block, mesh, block_plan(sequence_parallel=True))
    plan = {}
    if stage.first:  # tokens in, replicated; the sum with pos_emb is cut by position
        plan["tok_emb"] = RowwiseParallel(input_layouts=Replicate())
        plan[f"blocks.{stage.layers.start}"] = PrepareModuleInput(
            input_layouts=Replicate(), desired_input_layouts=Shard(1), use_local_output=True
        )
    if stage.last:
        plan["ln_f"] = SequenceParallel()
        plan["lm_head"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    parallelize_module(stage, mesh, plan)
    if stage.first and stage.last and stage.cfg.tie_word_embeddings:
        stage.lm_head.weight = stage.tok_emb.weight  # each style made its own DTensor: retie


def in_model_order(name: str, tensor: torch.Tensor, cfg: ModelConfig, tp: int) -> torch.Tensor:
    """A tensor as the model lays it out. Only qkv differs: its rows are in rank order."""
    if not name.split(".exp_avg")[0].endswith(("attn.qkv.weight", "attn.qkv.bias")):
        return tensor
    full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
    return full[torch.argsort(heads_in_rank_order(cfg, tp))]  # the inverse permutation


# --8<-- [end:tp]


# --8<-- [start:tied]
def sum_tied_gradients(weight: nn.Parameter, group: dist.ProcessGroup) -> None:
    """The embedding's gradient (first stage) plus the head's (last stage), on both ranks."""
    if isinstance(weight, DTensor):  # the embedding's comes out whole: keep the shard's rows
        weight.grad = weight.grad.redistribute(weight.device_mesh, weight.placements)
    grad = weight.grad.to_local() if isinstance(weight.grad, DTensor) else weight.grad
    dist.all_reduce(grad, group=group)  # the same rows on both: the same shard of the grid


# --8<-- [end:tied]
