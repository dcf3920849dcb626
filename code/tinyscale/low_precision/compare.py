# --8<-- [start:header]
"""Train the course model in fp32, bf16 and fp8 (three scalings, and none) on the same data.

Launch:  python -m tinyscale.low_precision.compare --steps 60

Same seed, same initial weights, same batches, same optimizer (fp32 master weights and
AdamW state in every run): only the arithmetic of the matmuls differs. bf16 runs the
forward pass under autocast; fp8 swaps every linear layer but the output one for a
Float8Linear. The table gives each variant's held-out loss at the end.
"""

from collections.abc import Sequence

import torch

from tinyscale.core.comparison import ScoredRun, check_steps, train_and_score
from tinyscale.core.config import ModelConfig
from tinyscale.core.data import LMData, build_datasets
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.core.model import TinyTransformer
from tinyscale.core.training import seed_everything
from tinyscale.low_precision.float8_linear import RECIPES, convert_to_float8

# fp32 and bf16 in the course's words; fp8-<recipe> for each Float8Linear recipe
VARIANTS = ("fp32", "bf16", *(f"fp8-{recipe}" for recipe in RECIPES))

# --8<-- [end:header]


# --8<-- [start:train]
def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise UsageError(f"unknown variant {variant!r}: use one of {', '.join(VARIANTS)}")
    return variant


def build(variant: str, data: LMData, seed: int) -> TinyTransformer:
    """The course model, seeded, with its linear layers swapped for fp8 ones if asked."""
    check_variant(variant)
    seed_everything(seed)
    model = TinyTransformer(ModelConfig(max_position_embeddings=data.train.block_size))
    if variant.startswith("fp8-"):
        convert_to_float8(model, recipe=variant.removeprefix("fp8-"))
    return model


def train_variant(
    variant: str, data: LMData, *, steps: int, eval_every: int, seed: int = 0,
    max_steps: int | None = None,
) -> ScoredRun:  # fmt: skip
    """The comparisons' loop (tinyscale.core.comparison); bf16 runs under autocast."""
    precision = "bf16" if variant == "bf16" else "fp32"  # fp8 lives inside the layers
    return train_and_score(lambda: build(variant, data, seed), data, steps=steps,
                           eval_every=eval_every, seed=seed, max_steps=max_steps,
                           precision=precision)  # fmt: skip


# --8<-- [end:train]


# --8<-- [start:main]
def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), metavar="VARIANT",
                        help=f"any of {', '.join(VARIANTS)}")  # fmt: skip
    args = parser.parse_args(argv)
    if args.eval_every < 1:
        raise UsageError(f"--eval-every {args.eval_every}: use 1 or more")
    for variant in args.variants:
        check_variant(variant)  # before the first run, not after five
    torch.set_num_threads(1)  # the same arithmetic on every machine
    data = build_datasets(vocab_size=1024, block_size=64)
    check_steps(args.steps, data)
    print(f"{'variant':<16} {'held-out loss':>14} {'after':>6}")
    for variant in args.variants:
        result = train_variant(variant, data, steps=args.steps, eval_every=args.eval_every)
        print(f"{variant:<16} {result.curve[-1][1]:>14.3f} {result.curve[-1][0]:>6}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
# --8<-- [end:main]
