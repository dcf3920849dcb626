# --8<-- [start:header]
"""torch's parallelisms composed on one layout: cut the stage, split its matrices, shard it.

Launch:  torchrun --standalone --nproc-per-node 4 code/scripts/parallel_train.py --fsdp 2 --tp 2

The order is the course's, and torchtitan's. The pipeline cuts this rank's stage out of the
whole model first: it decides which modules a rank keeps at all. Tensor parallelism then
turns each of the stage's weights into a DTensor on the tp mesh (sequence parallel on).
FSDP2 comes last and shards those DTensors again, over dp_replicate x dp_shard (HSDP:
shard inside, replicate across). Each step works on what the one before left. A script
gives the whole model and the built layout; it gets its stage, and a ``StageStep``: the
loss, the backward and the clipping that the shape changes in Lab 1's ``train_step``.
"""

import dataclasses
import functools

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from tinyscale.comm.parallel_layout import ParallelMesh
from tinyscale.core.model import ModelStage, TinyTransformer
from tinyscale.pipeline_parallel.pipeline import split_layers
from tinyscale.pipeline_parallel.torch_pipeline import clip_sharded_grad_norm, microbatch_loss
from tinyscale.tensor_parallel.tp_stage import parallelize_stage, sum_tied_gradients

# --8<-- [end:header]


# --8<-- [start:parallelize]
def parallelize(model: TinyTransformer, parallel: ParallelMesh, *, rank: int) -> ModelStage:
    """This rank's stage of ``model``: cut by pp, split by tp, sharded over dp x fsdp."""
    layout, mesh = parallel.layout, parallel.mesh
    pp_rank = layout.coordinate(rank)["pp"]
    layers = split_layers(model.cfg.num_hidden_layers, layout.pp)[pp_rank]
    stage = ModelStage(model, layers=layers, first=pp_rank == 0, last=pp_rank == layout.pp - 1)
    if layout.tp > 1:
        parallelize_stage(stage, mesh["tp"])
    if layout.data_parallel > 1:  # FSDP2 on a 2-D mesh: HSDP, shard inner, copy outer
        data_mesh = mesh["dp_replicate", "dp_shard"]
        for block in stage.blocks.values():
            fully_shard(block, mesh=data_mesh)
        fully_shard(stage, mesh=data_mesh)
    return stage


# --8<-- [end:parallelize]


# --8<-- [start:step]
@dataclasses.dataclass
class StageStep:
    """What the shape changes in a training step: ``loss``, ``backward`` and ``clip`` for
    ``core.step.train_step``. With pp > 1, torch's 1F1B schedule runs every micro-batch's
    forward and backward; the tied embedding's two copies sum their gradients; the norm is
    taken over every shard and every stage."""

    stage: ModelStage
    parallel: ParallelMesh
    schedule: Schedule1F1B | None = None
    tied: dist.ProcessGroup | None = None

    @classmethod
    def build(
        cls, stage: ModelStage, parallel: ParallelMesh, *, rank: int, microbatches: int,
        device: torch.device,
    ) -> "StageStep":  # fmt: skip
        layout, schedule, tied = parallel.layout, None, None
        if layout.pp > 1:
            pp_stage = PipelineStage(stage, layout.coordinate(rank)["pp"], layout.pp, device,
                                     group=parallel.group("pp"))  # fmt: skip
            loss_fn = functools.partial(microbatch_loss, microbatches=microbatches)
            schedule = Schedule1F1B(pp_stage, n_microbatches=microbatches, loss_fn=loss_fn,
                                    scale_grads=False)  # fmt: skip
            if stage.cfg.tie_word_embeddings:  # one group per (dp, fsdp, tp) place's two ends
                tied = parallel.subgroup([[line[0], line[-1]] for line in layout.groups("pp")])
        return cls(stage=stage, parallel=parallel, schedule=schedule, tied=tied)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The loss of this copy's batch; with pp > 1, after the schedule's every backward
        (on the last stage; a zero elsewhere)."""
        if self.schedule is None:
            return TinyTransformer.loss(self.stage(x), y)
        losses: list[torch.Tensor] = []  # filled on the last stage only
        self.schedule.step(*((x,) if self.stage.first else ()), target=y, losses=losses)
        return torch.stack(losses).sum() if losses else torch.zeros((), device=y.device)

    def backward(self, loss: torch.Tensor) -> None:
        if self.schedule is None:  # with pp > 1 the schedule has run every backward
            loss.backward()
        if self.tied is not None:  # the embedding's and the head's gradients, summed
            first = self.stage.first
            weight = self.stage.tok_emb.weight if first else self.stage.lm_head.weight
            sum_tied_gradients(weight, self.tied)

    def clip(self, module: ModelStage, max_norm: float) -> float:
        """The norm of every shard of every stage, clipped to ``max_norm``."""
        pp = self.parallel.layout.pp
        group = self.parallel.group("pp") if pp > 1 else None
        return clip_sharded_grad_norm(module, max_norm, group=group, tied_copy=pp > 1)


# --8<-- [end:step]
