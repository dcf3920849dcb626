# --8<-- [start:checkpoint]
"""A DCP checkpoint that does not know the parallel shape: saved on one, resumed on any.

Launch:  torchrun --standalone --nproc-per-node 4 code/scripts/parallel_train.py --fsdp 2 --tp 2
Resume:  the same with --resume auto and another shape (--pp 2 --dp 2)

Every tensor is saved under its name in the model, in the model's own layout: DCP writes
each rank's pieces of a DTensor and, on load, hands each rank the pieces its own layout
needs. Two tensors need care: the tied head is saved once, as tok_emb.weight, whichever
stage holds it; the fused qkv, whose rows tensor parallelism keeps in rank order, is
saved whole in the model's order and put back in rank order on load. The rest of the
training state (the step, the configs, every rank's random-number state) is one small
file beside the shards, written by rank 0.
"""

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import distribute_tensor

from tinyscale.core.checkpoint import (
    checkpoint_name,
    load_checkpoint,
    restore_training_state,
    save_checkpoint,
    training_state,
    verify_checkpoint,
)
from tinyscale.core.config import ModelConfig
from tinyscale.core.model import ModelStage
from tinyscale.core.training import TrainConfig
from tinyscale.data_parallel.dcp_checkpoint import load_dcp, save_dcp
from tinyscale.data_parallel.ddp_training import gather_rng_states
from tinyscale.tensor_parallel.tp_dtensor import heads_in_rank_order
from tinyscale.tensor_parallel.tp_stage import in_model_order

SHAPE_FILE = "shape.json"  # the shape that saved it, for people: any shape loads it
STATE_FILE = "training_state.pt"  # the step, the configs, every rank's RNG state


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
                   step: int, epoch: int, cfg: TrainConfig, tp: int, shape: Mapping[str, int],
                   device: torch.device) -> Path:  # fmt: skip
    """One DCP directory per step: complete once rank 0 has written its manifest, last.

    Every rank calls it. Rank 0 writes the rest of the training state beside the shards
    (``training_state`` without the weights, with every rank's RNG state), and ``shape``
    (the degrees by flag) in shape.json.
    """
    path = Path(checkpoints, checkpoint_name(step))
    rng = gather_rng_states(device)  # each rank's own stream: its dropout masks go on
    if dist.get_rank() == 0:
        if path.exists():  # saved before by a run we resumed from an earlier step: new
            shutil.rmtree(path)  # files under the old manifest would be a corrupt mix
        path.mkdir(parents=True)
        (path / SHAPE_FILE).write_text(json.dumps(dict(shape)))  # {"pp": 1, "dp": 1, ...}
        state = training_state(model=stage, optimizer=optimizer, cfg=cfg, step=step,
                               epoch=epoch, device=device, weights=False, shape=dict(shape),
                               world_size=dist.get_world_size())  # fmt: skip
        save_checkpoint({**state, **rng}, path / STATE_FILE)
    dist.barrier()
    tensors = checkpoint_state(stage, optimizer, cfg=stage.cfg, tp=tp)
    tensors["step"] = torch.tensor(step)
    save_dcp(tensors, path, also=(SHAPE_FILE, STATE_FILE))  # rank 0 commits it: manifest
    return path


def read_training_state(path: Path, *, expect: ModelConfig) -> dict[str, Any]:
    """Before any work, on every rank: the checkpoint whole (the manifest's sizes), this
    model's (``expect``), and its training state: the step, the shape, the RNG states."""
    verify_checkpoint(path)
    return load_checkpoint(path / STATE_FILE, expect=expect)


def load_any_shape(stage: ModelStage, optimizer: torch.optim.Optimizer, path: Path, *,
                   state: dict[str, Any], tp: int, shape: Mapping[str, int],
                   device: torch.device) -> int:  # fmt: skip
    """Fill this shape's tensors from a checkpoint saved on any shape; returns its step.

    On the shape that saved it, every rank also goes on with its own random stream, so
    the dropout masks are those of a run that never stopped. On another shape the ranks'
    places differ: each keeps the stream it was seeded with.
    """
    tensors = checkpoint_state(stage, optimizer, cfg=stage.cfg, tp=tp, for_loading=True)
    tensors["step"] = torch.tensor(0)
    load_dcp(tensors, path)
    place_qkv(stage, optimizer, tensors, cfg=stage.cfg, tp=tp)
    for p in stage.parameters():  # one AdamW step count for every parameter
        optimizer.state[p]["step"] = tensors["adamw.step"].clone()
    if state["shape"] == dict(shape):  # the weights are in: put back the rest, RNG too
        restore_training_state(state, stage, optimizer, device=device, rank=dist.get_rank())
    return int(tensors["step"])


# --8<-- [end:checkpoint]
