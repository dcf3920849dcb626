# --8<-- [start:header]
"""Train the course model dense and as a mixture of experts, on the same data, and compare.

Launch:  python -m tinyscale.expert_parallel.moe_compare --steps 60 --variants dense moe

Variants: "dense" is the course model; "dense-wide" widens its FFN until it holds as many
parameters as the MoE; "moe", "moe-bias" and "moe-none" put 8 experts (top 1, each as
wide as the dense FFN) in every block, kept in balance by the auxiliary loss, by the
per-expert bias, or not at all. Same seed, same batches, same optimizer. The table gives
each variant's parameters, the FLOPs of one training step (counted by torch), the
held-out loss at the end and how uneven the experts' load was (max / mean).
"""

import dataclasses
from collections.abc import Sequence

import torch
from torch.utils.flop_counter import FlopCounterMode

from tinyscale.core.comparison import check_steps, train_and_score
from tinyscale.core.config import ModelConfig
from tinyscale.core.data import LMData, build_datasets, get_batch
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.core.model import TinyTransformer
from tinyscale.core.training import seed_everything
from tinyscale.expert_parallel.moe import convert_to_moe, moe_layers, moe_loss, parameter_counts
from tinyscale.expert_parallel.moe_routing import MoEConfig

BALANCING = {"moe": "aux", "moe-bias": "bias", "moe-none": "none"}
VARIANTS = ("dense", "dense-wide", *BALANCING)
CPU = torch.device("cpu")

# --8<-- [end:header]


# --8<-- [start:build]
def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise UsageError(f"unknown variant {variant!r}: use one of {', '.join(VARIANTS)}")
    return variant


def build(variant: str, data: LMData, moe: MoEConfig, seed: int = 0) -> TinyTransformer:
    """The course model, seeded; its FFNs widened E/k times, or swapped for MoE layers."""
    check_variant(variant)
    seed_everything(seed)
    cfg = ModelConfig(max_position_embeddings=data.train.block_size)
    if variant == "dense-wide":  # as many FFN parameters as E experts of width 256/k
        cfg = dataclasses.replace(cfg, intermediate_size=cfg.intermediate_size
                                  * moe.num_experts // moe.top_k)  # fmt: skip
    model = TinyTransformer(cfg)
    if variant in BALANCING:
        convert_to_moe(model, dataclasses.replace(moe, balance=BALANCING[variant]))
    return model


def step_flops(model: TinyTransformer, data: LMData, batch: int = 16) -> int:
    """FLOPs of one forward and backward on ``batch`` blocks, counted by torch's FlopCounter
    (matrix products; an MoE's expert products at the sizes its routing produced)."""
    inputs, targets = get_batch(data.train, torch.arange(batch), CPU)
    with FlopCounterMode(display=False) as counter:
        _, loss = model(inputs, targets)
        (loss + moe_loss(model)).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


# --8<-- [end:build]


# --8<-- [start:train]
@dataclasses.dataclass(frozen=True)
class Result:
    variant: str
    curve: list[tuple[int, float]]  # (step, held-out loss)
    imbalance: list[tuple[int, float]]  # (step, max/mean load over the steps since the last)
    seconds_per_step: float  # CPU time, its share of the held-out evaluations included
    model: TinyTransformer = dataclasses.field(repr=False)  # as trained


def imbalance(model: TinyTransformer) -> float:
    """max / mean of the tokens per expert in the last forward, averaged over the layers
    (1.0: perfectly even; E/k: every token in the same k experts)."""
    loads = [layer.load.float() for layer in moe_layers(model)]
    return sum((load.max() / load.mean()).item() for load in loads) / max(1, len(loads))


def train_variant(
    variant: str, data: LMData, moe: MoEConfig, *, steps: int, eval_every: int,
    seed: int = 0, max_steps: int | None = None,
) -> Result:  # fmt: skip
    """The comparisons' loop (tinyscale.core.comparison), plus the MoE's two extras: its
    losses join the task loss, and with balance="bias" each router's bias moves after
    every step. The load's max/mean is averaged over the steps between evaluations."""
    per_step: list[float] = []

    def after_step(model: TinyTransformer) -> None:
        for layer in moe_layers(model):
            if layer.cfg.balance == "bias":
                layer.router.update_bias(layer.load)  # outside autograd: no gradient
        per_step.append(imbalance(model))  # the load of this step's forward

    run = train_and_score(lambda: build(variant, data, moe, seed), data, steps=steps,
                          eval_every=eval_every, seed=seed, max_steps=max_steps,
                          extra_loss=moe_loss, after_step=after_step)  # fmt: skip
    uneven, since = [], 0
    for step, _ in run.curve[1:]:  # at each evaluation: the mean over the steps since the last
        window = per_step[since:step]
        uneven.append((step, sum(window) / len(window)))
        since = step
    return Result(variant, run.curve, uneven, run.seconds_per_step, run.model)


# --8<-- [end:train]


# --8<-- [start:drops]
@torch.no_grad()
def drop_rates(model: TinyTransformer, data: LMData, factors: Sequence[float | None]) -> dict:
    """Share of the (token, expert) assignments dropped on 64 held-out blocks, for each
    capacity factor (None: dropless), and the tokens each expert was sent, per layer."""
    model.eval()
    inputs, _ = get_batch(data.heldout, torch.arange(64), CPU)
    layers = moe_layers(model)
    configs = [layer.cfg for layer in layers]
    rates, loads = {}, []
    for factor in factors:
        for layer, cfg in zip(layers, configs, strict=True):
            layer.cfg = dataclasses.replace(cfg, capacity_factor=factor)  # the slots only
        model(inputs)
        assigned = sum(int(layer.load.sum()) for layer in layers)
        rates[factor] = sum(layer.dropped for layer in layers) / assigned
        if factor is None:
            loads = [layer.load.tolist() for layer in layers]
    for layer, cfg in zip(layers, configs, strict=True):
        layer.cfg = cfg
    return {"drop_rate": rates, "load": loads}


# --8<-- [end:drops]


# --8<-- [start:main]
def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--max-steps", type=int, default=None,
                        help="stop after this many steps of the --steps schedule")  # fmt: skip
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), metavar="VARIANT",
                        help=f"any of {', '.join(VARIANTS)}")  # fmt: skip
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=1)
    parser.add_argument("--capacity-factor", type=float, default=None,
                        help="slots per expert over k*T/E; leave out for dropless routing")  # fmt: skip
    args = parser.parse_args(argv)
    moe = MoEConfig(args.experts, args.top_k, args.capacity_factor)  # checks all three
    if args.eval_every < 1:
        raise UsageError(f"--eval-every {args.eval_every}: use 1 or more")
    if args.max_steps is not None and not 1 <= args.max_steps <= args.steps:
        raise UsageError(f"--max-steps {args.max_steps}: use 1 to --steps ({args.steps})")
    for variant in args.variants:
        check_variant(variant)  # before the first run, not after five
    data = build_datasets(vocab_size=1024, block_size=64)
    check_steps(args.steps, data)
    torch.set_num_threads(1)  # the same arithmetic on every machine
    print(f"{'variant':<11} {'parameters':>10} {'per token':>10} {'MFLOP/step':>10} "
          f"{'held-out':>8} {'max/mean':>8}")  # fmt: skip
    for variant in args.variants:
        fresh = build(variant, data, moe)  # sizes and FLOPs, before training
        total, active = parameter_counts(fresh)
        flops = step_flops(fresh, data)
        result = train_variant(variant, data, moe, steps=args.steps, eval_every=args.eval_every,
                               max_steps=args.max_steps)  # fmt: skip
        uneven = (
            f"{result.imbalance[-1][1]:.2f}" if result.imbalance and variant in BALANCING else "-"
        )
        print(f"{variant:<11} {total:>10,} {active:>10,} {flops / 1e6:>10,.0f} "
              f"{result.curve[-1][1]:>8.3f} {uneven:>8}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
# --8<-- [end:main]
