# --8<-- [start:checkpoint]
"""A DCP checkpoint that does not know the parallel shape: saved on one, resumed on any.

Launch:  torchrun --standalone --nproc-per-node 4 code/scripts/parallel_train.py --fsdp 2 --tp 2
Resume:  the same with --resume auto and another shape (--pp 2 --dp 2)

Every tensor is saved under its name in the model, in the model's own layout: DCP writes
each rank's pieces of a DTensor and, on load, hands each rank the pieces its own layout
needs. Two tensors need care: the tied head is saved once, as tok_emb.weight, whichever
stage holds it; the fused qkv, whose rows tensor parallelism keeps in rank order, is
saved whole in the model's order and put back in rank order on load.
"""

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import distribute_tensor

from tinyscale.core.checkpoint import checkpoint_name
from tinyscale.core.config import ModelConfig
from tinyscale.core.model import ModelStage
from tinyscale.data_parallel.dcp_checkpoint import load_dcp, save_dcp
from tinyscale.tensor_parallel.tp_dtensor import heads_in_rank_order
from tinyscale.tensor_parallel.tp_stage import in_model_order

SHAPE_FILE = "shape.json"  # the shape that saved it, for people: any shape loads it


def checkpoint_state(stage: ModelStage, optimizer: torch.optim.Optimizer, *, cfg: ModelConfig,
                     tp: int, for_loading: bool = False) -> dict[str, torch.Tensor]:  # fmt: skip
    """Name -> tensor for DCP: parameters and AdamW moments under the model's names.

    DTensors keep their shards: DCP writes each rank's pieces and reshards on load. The
    tied head is saved as tok_emb.weight (one name, whichever stage holds it). qkv is
    saved whole, in the model's row order (``in_model_order``); to load, a template.
    """
    state: dict[str, torch.Tensor] = {}
    for name, p in stage.named_parameters():
        key = "tok_emb.weight" if cfg.tie_word_embeddings and name == "lm_head.weight" else name
        moments = optimizer.state[p]
        if not moments:  # a fresh optimizer: zero moments, to be filled by the load
            moments.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p),
                           exp_avg_sq=torch.zeros_like(p))  # fmt: skip
        for suffix, t in (("", p.detach()), (".exp_avg", moments["exp_avg"]),
                          (".exp_avg_sq", moments["exp_avg_sq"])):  # fmt: skip
            if key.endswith(("attn.qkv.weight", "attn.qkv.bias")) and tp > 1:
                full_shape = t.shape  # a DTensor's shape is the whole tensor's
                t = (
                    torch.empty(full_shape, device=p.device)
                    if for_loading
                    else in_model_order(key + suffix, t, cfg, tp)
                )
            state[key + suffix] = t
        state["adamw.step"] = moments["step"]
    return state


def place_qkv(stage: ModelStage, optimizer: torch.optim.Optimizer, loaded: dict, *,
              cfg: ModelConfig, tp: int) -> None:  # fmt: skip
    """After a load: qkv's whole tensors back into rank order and into this rank's shards."""
    order = heads_in_rank_order(cfg, tp)
    for name, p in stage.named_parameters():
        if not name.endswith(("attn.qkv.weight", "attn.qkv.bias")) or tp == 1:
            continue
        moments = optimizer.state[p]
        for suffix, target in (("", p), (".exp_avg", moments["exp_avg"]),
                               (".exp_avg_sq", moments["exp_avg_sq"])):  # fmt: skip
            mine = distribute_tensor(loaded[name + suffix][order.to(p.device)], target.device_mesh,
                                     target.placements)  # fmt: skip
            with torch.no_grad():
                target.to_local().copy_(mine.to_local())


def save_any_shape(stage: ModelStage, optimizer: torch.optim.Optimizer, checkpoints: Path, *,
                   step: int, cfg: ModelConfig, tp: int, shape: Mapping[str, int]) -> Path:  # fmt: skip
    """One DCP directory per step: complete once rank 0 has written .metadata, last.

    Every rank calls it. ``shape`` (the degrees by flag) goes beside, in shape.json.
    """
    path = Path(checkpoints, checkpoint_name(step))
    if dist.get_rank() == 0:
        if path.exists():  # saved before by a run we resumed from an earlier step: new
            shutil.rmtree(path)  # files under the old .metadata would be a corrupt mix
        path.mkdir(parents=True)
        (path / SHAPE_FILE).write_text(json.dumps(dict(shape)))  # {"pp": 1, "dp": 1, ...}
    dist.barrier()
    state = checkpoint_state(stage, optimizer, cfg=cfg, tp=tp)
    state["step"] = torch.tensor(step)
    save_dcp(state, path)  # every rank writes its pieces; rank 0 writes .metadata last
    return path


def load_any_shape(stage: ModelStage, optimizer: torch.optim.Optimizer, path: Path, *,
                   cfg: ModelConfig, tp: int) -> int:  # fmt: skip
    """Fill this shape's tensors from a checkpoint saved on any shape; returns its step."""
    state = checkpoint_state(stage, optimizer, cfg=cfg, tp=tp, for_loading=True)
    state["step"] = torch.tensor(0)
    load_dcp(state, path)
    place_qkv(stage, optimizer, state, cfg=cfg, tp=tp)
    for p in stage.parameters():  # one AdamW step count for every parameter
        optimizer.state[p]["step"] = state["adamw.step"].clone()
    return int(state["step"])


# --8<-- [end:checkpoint]
