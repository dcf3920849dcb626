# --8<-- [start:count]
"""What ZeRO saves and what it costs in DeepSpeed: bytes per rank and traffic per step, counted.

Try it:  python -m tinyscale.compat.deepspeed_costs --world-size 2

Mixed-precision Adam keeps 16 bytes per parameter (Ψ parameters): 2Ψ bf16 weights,
2Ψ bf16 gradients and 12Ψ optimizer state (fp32 master weights, momentum, variance).
ZeRO (Rajbhandari et al., 2020, Figure 1 and Section 7) splits them over the N data-parallel
ranks; tinyscale.data_parallel.memory_calculator has the formulas. Here the same numbers
are counted in DeepSpeed's engine: the bytes each rank holds, and what its collectives
move (tinyscale.comm.counter).
"""

import argparse
import contextlib
import dataclasses
import sys
from collections import Counter
from collections.abc import Sequence

import torch
import torch.distributed as dist

from tinyscale.comm.counter import CollectiveCounter
from tinyscale.core.config import DEFAULT_CONFIG_PATH, load_model_config
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.core.memory import StateBytes, human_bytes, nbytes
from tinyscale.data_parallel.memory_calculator import zero_state_bytes, zero_traffic


def engine_state_bytes(engine: "deepspeed.DeepSpeedEngine") -> StateBytes:  # type: ignore[name-defined] # noqa: F821
    """Count the weight and optimizer bytes this rank really holds in a DeepSpeed engine.

    The weights are the model's bf16 parameters; under ZeRO-3 each one is only this rank's
    slice, ``p.ds_tensor``, plus the whole copy of the small ones it keeps persistent. The optimizer state is this rank's partition of the fp32 master
    weights (ZeRO-1/2 and ZeRO-3 name the list differently) plus the Adam moments that the
    wrapped torch optimizer keeps for it. Gradients come and go inside backward and step,
    so they are not counted here.
    """
    params = list(engine.module.parameters())
    weights = [getattr(p, "ds_tensor", p) for p in params]
    # ZeRO-3 keeps weights of at most stage3_param_persistence_threshold elements whole on
    # every rank, in p.data beside the slice; the others' p.data is empty between uses
    weights += [p.data for p in params if hasattr(p, "ds_tensor")]
    zero = engine.optimizer  # DeepSpeed's ZeRO optimizer, wrapping the client torch optimizer
    stage12 = getattr(zero, "single_partition_of_fp32_groups", None)
    master = stage12 if stage12 is not None else zero.fp32_partitioned_groups_flat
    moments = [
        t
        for s in zero.optimizer.state.values()
        for t in s.values()
        if torch.is_tensor(t) and t.dim() > 0
    ]  # exp_avg, exp_avg_sq; the scalar 'step' is skipped
    return StateBytes(params=nbytes(weights), grads=0, optimizer=nbytes(master + moments))


# --8<-- [end:count]


# --8<-- [start:measure]
# What runs: the shipped configs, and two settings that make DeepSpeed move what the
# paper counts. ZeRO-1/2 all-reduce gradient buckets by default (2Ψ, then each rank keeps
# its slice); ZeRO-3 keeps gathered weights alive for the backward pass while fewer than
# stage3_max_live_parameters are live (the whole tiny model), so it gathers them only once.
# label: (stage, settings over the shipped JSON, moves what the paper counts)
VARIANTS = {
    "ZeRO-1": (1, {}, False),
    "ZeRO-2": (2, {}, False),
    "ZeRO-2 r": (2, {"use_multi_rank_bucket_allreduce": False}, True),  # reduce to each owner
    "ZeRO-3": (3, {}, False),
    "ZeRO-3 f": (3, {"stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 0}, True),
}
TRAFFIC_TOLERANCE = 0.01  # Ψ: the scalar all-reduces (gradient norm, overflow) on top
# Every variant takes the same two bf16 steps from the same weights on the same batch; only
# where the state lives differs. One bf16 rounding step of a loss near 7 is 2^-5 = 0.031.
LOSS_TOLERANCE = 0.031


@dataclasses.dataclass(frozen=True, kw_only=True)
class ZeroMeasurement:
    label: str
    stage: int
    rank: int
    num_params: int
    measured: StateBytes  # counted in the engine
    paper: StateBytes  # the formula: zero_state_bytes(..., precision="bf16")
    traffic: float  # elements this rank's collectives moved in one step, in units of Ψ
    loss: float  # of the second step: the same for every variant when only placement differs
    calls: dict[str, int]  # which collectives, how many times


def measure_rank(labels: Sequence[str], config_path: str) -> list[ZeroMeasurement]:
    """Run on every rank (``run_on_ranks``): one bf16 engine per stage, two steps each;
    count the state after them and the traffic of the second."""
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed logs to stdout; keep it for the table
        return _measure(labels, config_path)


def _measure(labels: Sequence[str], config_path: str) -> list[ZeroMeasurement]:
    import deepspeed

    from tinyscale.compat.deepspeed_config import (
        DS_CONFIG_DIR,
        load_ds_config,
        skip_unused_shm_build,
    )
    from tinyscale.core.model import TinyTransformer
    from tinyscale.core.training import TrainConfig, make_optimizer

    skip_unused_shm_build()
    counter = CollectiveCounter().install()  # before deepspeed.initialize: it keeps references
    model_cfg = load_model_config(config_path)
    found = []
    for label in labels:
        stage, settings, _ = VARIANTS[label]
        ds_config = load_ds_config(DS_CONFIG_DIR / f"zero{stage}.json", precision="bf16")
        ds_config["zero_optimization"].update(settings)
        ds_config["train_micro_batch_size_per_gpu"] = 2  # small steps: the sizes are the point
        torch.manual_seed(0)
        model = TinyTransformer(model_cfg)
        num_params = sum(p.numel() for p in model.parameters())
        optimizer = make_optimizer(model, TrainConfig())
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        x = torch.randint(0, model_cfg.vocab_size, (2, model_cfg.max_position_embeddings))
        for step in range(2):  # the first step also builds buffers and Adam's moments
            counter.counting = step == 1
            counter.clear()
            _, loss = engine(x, x)
            engine.backward(loss)
            engine.step()
        counter.counting = False
        found.append(
            ZeroMeasurement(
                label=label,
                stage=stage,
                rank=dist.get_rank(),
                num_params=num_params,
                measured=engine_state_bytes(engine),
                paper=zero_state_bytes(
                    num_params, stage=stage, world_size=dist.get_world_size(), precision="bf16"
                ),
                traffic=counter.volume() / num_params,
                loss=loss.item(),
                calls=dict(counter.ops()),
            )
        )
        engine.destroy()  # ZeRO-3 leaves hooks on the module; free them before the next stage
    counter.remove()
    return found


# --8<-- [end:measure]


# --8<-- [start:main]
def shared_fraction(model: torch.nn.Module) -> float:
    """The part of Ψ in weights that sit in two places (tied embeddings), as a fraction."""
    seen = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    params = list(model.parameters())
    return sum(p.numel() for p in params if seen[id(p)] > 1) / sum(p.numel() for p in params)


def main(argv: Sequence[str] | None = None) -> int:
    from tinyscale.comm.launch import run_on_ranks
    from tinyscale.core.model import TinyTransformer

    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-size", type=int, default=2, help="data-parallel ranks (processes)")
    p.add_argument("--config", default=str(DEFAULT_CONFIG_PATH), help="model config JSON")
    args = p.parse_args(argv)
    if not 2 <= args.world_size <= 8:
        raise UsageError(f"--world-size {args.world_size}: use 2 to 8 processes on one machine")
    shared = shared_fraction(TinyTransformer(load_model_config(args.config)))
    ranks = run_on_ranks(
        measure_rank, args.world_size, list(VARIANTS), args.config, timeout_s=60, deadline_s=240
    )
    psi = ranks[0][0].num_params
    print(f"Ψ = {psi:,} parameters on {args.world_size} ranks, bf16 weights and fp32 Adam")
    print(f"{'per rank':10}{'weights':24}{'optimizer state':24}{'traffic per step':18}loss")
    print(f"{'no ZeRO':10}{human_bytes(2 * psi):24}{human_bytes(12 * psi):24}2 Ψ (paper)")
    wrong = []
    for row in zip(*ranks, strict=True):  # the same variant, measured on every rank
        first = row[0]
        m, paper = first.measured, first.paper
        expected = zero_traffic(first.stage, shared=shared)
        if abs(first.loss - ranks[0][0].loss) > LOSS_TOLERANCE:
            wrong.append(f"{first.label}: loss {first.loss} differs from {ranks[0][0].loss}")
        if any((r.measured, r.traffic) != (m, first.traffic) for r in row):
            wrong.append(f"{first.label}: ranks differ")  # every rank holds an equal share
        if (m.params, m.optimizer) != (paper.params, paper.optimizer):
            wrong.append(f"{first.label}: {m} is not the paper's {paper}")
        if VARIANTS[first.label][2] and abs(first.traffic - expected) > TRAFFIC_TOLERANCE:
            wrong.append(f"{first.label}: moved {first.traffic:.3f} Ψ, not {expected:.3f} Ψ")
        print(
            f"{first.label:10}{human_bytes(m.params) + ' (' + human_bytes(paper.params) + ')':24}"
            f"{human_bytes(m.optimizer) + ' (' + human_bytes(paper.optimizer) + ')':24}"
            f"{f'{first.traffic:.2f} Ψ ({expected:.2f} Ψ)':18}{first.loss:.4f}"
        )
    print("measured (paper); r: gradients reduced to their owners, f: weights freed after use")
    # DeepSpeed pads each parameter group to a multiple of 2N elements (ZeRO-1/2) and each
    # tensor to a multiple of N (ZeRO-3); the tiny model needs no padding, so equal is exact
    if wrong:
        raise RuntimeError("; ".join(wrong))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
# --8<-- [end:main]
