# --8<-- [start:header]
"""Floating-point formats from fp32 down to fp8: what each can hold, and what happens to the
values it cannot.

Launch:  python -m tinyscale.low_precision.formats

A float is a sign, an exponent and a mantissa. The exponent bits set the *range* (the
largest value, the smallest normal one); the mantissa bits set the *precision* (the step
from 1 to the next value, epsilon). fp8 has 8 bits to share: e4m3 keeps 3 mantissa bits
and reaches 448; e5m2 keeps 2 and reaches 57344 (Micikevicius et al. 2022, "FP8 Formats
for Deep Learning", arXiv:2209.05433). The ``fnuz`` variants (AMD's) have no negative zero
and no infinity, and a bias one larger.
"""

import dataclasses
import math
from collections.abc import Sequence

import torch

from tinyscale.core.config import ModelConfig
from tinyscale.core.data import build_datasets, get_batch
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.core.model import TinyTransformer
from tinyscale.core.parity import flat_parameters

# --8<-- [end:header]


# --8<-- [start:formats]
# The course's names for the formats (fp8 names say exponent and mantissa bits).
FORMATS: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "e4m3": torch.float8_e4m3fn,  # fn: finite only, saturates at 448
    "e5m2": torch.float8_e5m2,  # IEEE-like: overflows to inf
    "e4m3fnuz": torch.float8_e4m3fnuz,
    "e5m2fnuz": torch.float8_e5m2fnuz,
}


def dtype_of(name: str) -> torch.dtype:
    """The torch dtype of one of ``FORMATS``; one line listing them if the name is unknown."""
    if name not in FORMATS:
        raise UsageError(f"unknown format {name!r}: use one of {', '.join(FORMATS)}")
    return FORMATS[name]


def roundtrip(x: torch.Tensor, name: str) -> torch.Tensor:
    """``x`` cast to the format and back to fp32: the values that format would store."""
    return x.float().to(dtype_of(name)).float()


@dataclasses.dataclass(frozen=True)
class FormatFacts:
    name: str
    bits: int
    exponent_bits: int
    mantissa_bits: int
    max: float  # largest finite value
    smallest_normal: float
    smallest_subnormal: float  # the last value above zero
    eps: float  # the step from 1.0 to the next value
    on_overflow: str  # what a value past max becomes when cast: "max", "inf" or "nan"


def measure(name: str) -> FormatFacts:
    """The format's facts, found by casting values to it and back. Only the bit count and
    the max come from ``torch.finfo`` (the max checked by a cast): finfo is not always right,
    it reports eps 0.125 for e5m2fnuz, whose step above 1 is 0.25."""
    info = torch.finfo(dtype_of(name))

    def kept(value: float) -> bool:
        return roundtrip(torch.tensor(value), name).item() == value

    eps = 1.0
    while kept(1 + eps / 2):  # the smallest step above 1 that survives
        eps /= 2
    normal = 1.0
    while kept(normal / 2 * (1 + eps)):  # below the smallest normal, that step is lost
        normal /= 2
    subnormal = normal
    while subnormal / 2 > 0 and kept(subnormal / 2):  # then bits go one by one, to zero
        subnormal /= 2
    if not kept(info.max):
        raise RuntimeError(f"{name}: torch.finfo's max, {info.max}, does not survive a cast")
    past = roundtrip(torch.tensor(info.max * 4), name).item()
    overflow = "max" if past == info.max else "inf" if math.isinf(past) else "nan"
    mantissa = round(-math.log2(eps))
    return FormatFacts(name=name, bits=info.bits, exponent_bits=info.bits - 1 - mantissa,
                       mantissa_bits=mantissa, max=info.max, smallest_normal=normal,
                       smallest_subnormal=subnormal, eps=eps, on_overflow=overflow)  # fmt: skip


# --8<-- [end:formats]


# --8<-- [start:survives]
@dataclasses.dataclass(frozen=True)
class Survival:
    """What a cast did to a tensor's values."""

    saturated: float  # fraction clamped to the format's max (e4m3)
    overflowed: float  # fraction turned into inf or nan
    flushed: float  # fraction of non-zero values that became zero
    rel_error: float  # mean |cast - x| / |x| over the values that stayed finite and non-zero


def survival(x: torch.Tensor, name: str) -> Survival:
    """Cast ``x`` to the format (no scaling) and count what was lost."""
    x = x.float().flatten()
    y = roundtrip(x, name)
    finite_max = torch.finfo(dtype_of(name)).max
    nonzero = x != 0
    saturated = (y.abs() == finite_max) & (x.abs() > finite_max)
    overflowed = ~torch.isfinite(y)
    flushed = nonzero & (y == 0)
    kept = nonzero & torch.isfinite(y) & (y != 0)
    rel = ((y - x).abs() / x.abs())[kept].mean().item() if kept.any() else float("nan")
    n = max(x.numel(), 1)
    return Survival(saturated=saturated.sum().item() / n, overflowed=overflowed.sum().item() / n,
                    flushed=flushed.sum().item() / max(nonzero.sum().item(), 1),
                    rel_error=rel)  # fmt: skip


def one_step_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """What a training step of the course model holds, after one real forward and backward
    pass on 16 blocks of the corpus: all weights, all weight gradients, and the gradients
    flowing out of the linear layers (what an fp8 backward pass would cast to e5m2)."""
    torch.manual_seed(seed)
    data = build_datasets(vocab_size=1024, block_size=64)
    model = TinyTransformer(ModelConfig())
    output_grads: list[torch.Tensor] = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name != "lm_head":
            module.register_full_backward_hook(
                lambda m, gi, go: output_grads.append(go[0].flatten())
            )
    model(*get_batch(data.train, torch.arange(16), torch.device("cpu")))[1].backward()
    return {
        "weights": flat_parameters(model),
        "weight gradients": flat_parameters(model, grads=True),
        "output gradients": torch.cat(output_grads),
    }


# --8<-- [end:survives]


# --8<-- [start:main]
def table(names: Sequence[str]) -> str:
    """The facts of each format, one row each."""
    lines = [f"{'format':<9} {'bits':>4} {'e':>2} {'m':>2} {'max':>10} {'min normal':>10} "
             f"{'min subnormal':>13} {'eps':>9} {'past max':>8}"]  # fmt: skip
    for name in names:
        f = measure(name)
        lines.append(
            f"{f.name:<9} {f.bits:>4} {f.exponent_bits:>2} {f.mantissa_bits:>2} {f.max:>10.4g} "
            f"{f.smallest_normal:>10.3g} {f.smallest_subnormal:>13.3g} {f.eps:>9.3g} "
            f"{f.on_overflow:>8}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("formats", nargs="*", default=list(FORMATS), help="default: all")
    args = parser.parse_args(argv)
    for name in args.formats:
        dtype_of(name)  # one line naming the known formats, before any output
    print(table(args.formats))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
# --8<-- [end:main]
