# --8<-- [start:header]
"""Scaling for fp8: stretch a tensor's values over the format's range before the cast.

Launch:  python -m tinyscale.low_precision.scaling

e4m3 holds values up to 448 and flushes anything below 0.002 to zero; a weight of 0.01 or
a gradient of 1e-5 would lose most of its digits or all of them. So each tensor is
multiplied by a *scale* before the cast, chosen so that its largest magnitude (its *amax*)
lands at the format's max, and the matmul divides it out again:

    scale = fmax / amax          q = cast(x * scale)          x ≈ q / scale

Three ways to choose the scale, as in the FP8 training recipes of NVIDIA's Transformer
Engine and of torchao: *tensorwise* (one scale per tensor, from its current amax),
*rowwise* (one per row, so one outlier spoils only its own row) and *delayed* (one per
tensor, from the amax of the previous steps, so no pass over the tensor is needed before
the cast).
"""

import dataclasses
from collections.abc import Sequence

import torch

from tinyscale.core.errors import ArgumentParser, UsageError, run_cli

E4M3 = torch.float8_e4m3fn  # weights and activations: more precision
E5M2 = torch.float8_e5m2  # output gradients: more range
GRANULARITIES = ("tensorwise", "rowwise")
EPS = 1e-12  # an all-zero tensor gets a finite scale

# --8<-- [end:header]


# --8<-- [start:scale]
def amax_scale(amax: torch.Tensor, dtype: torch.dtype, *, margin: int = 0) -> torch.Tensor:
    """fmax / amax, divided by 2**margin for headroom; float32."""
    return torch.finfo(dtype).max / (amax.float().clamp(min=EPS) * 2.0**margin)


def compute_scale(x: torch.Tensor, dtype: torch.dtype, granularity: str, dim: int) -> torch.Tensor:
    """The scale of ``x``: one number (tensorwise) or one per slice along ``dim`` (rowwise:
    the amax is taken over ``dim``, the dimension a matmul sums over)."""
    if granularity == "tensorwise":
        return amax_scale(x.abs().amax(), dtype)
    if granularity == "rowwise":
        return amax_scale(x.abs().amax(dim=dim, keepdim=True), dtype)
    raise UsageError(f"unknown scaling {granularity!r}: use one of {', '.join(GRANULARITIES)}")


def quantize(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor) -> torch.Tensor:
    """cast(x * scale), clamped first: a value past fmax saturates instead of becoming inf."""
    fmax = torch.finfo(dtype).max
    return (x.float() * scale).clamp(-fmax, fmax).to(dtype)


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The values ``q`` stands for: q / scale, in float32."""
    return q.float() / scale


# --8<-- [end:scale]


# --8<-- [start:delayed]
@dataclasses.dataclass
class DelayedScaling:
    """A tensor's scale from the largest amax of its last ``history`` steps.

    The scale is known before the tensor is, so the cast needs no reduction over it first;
    the tensor's own amax joins the history after the cast. If it grew past the history's
    max, its largest values saturate for one step. ``margin`` divides the scale by
    2**margin: headroom for a growing amax, paid for with precision.
    """

    history: int = 16
    margin: int = 0
    amaxes: list[float] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.history < 1 or self.margin < 0:
            raise UsageError(
                f"amax history {self.history} and margin {self.margin}: need history >= 1, "
                "margin >= 0"
            )

    def scale(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The scale for ``x`` (from past steps; the first step has none, so it uses ``x``),
        then record ``x``'s amax."""
        amax = x.abs().amax().float()
        past = max(self.amaxes) if self.amaxes else amax.item()
        self.amaxes = [*self.amaxes, amax.item()][-self.history :]
        return amax_scale(torch.tensor(past), dtype, margin=self.margin)


# --8<-- [end:delayed]


# --8<-- [start:main]
def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    x = torch.randn(4, 8) * 1e-3  # small values, like a weight update or a gradient
    x[0, 0] = 50.0  # one outlier, in row 0
    scales = {
        "e4m3, no scale": torch.tensor(1.0),
        "e4m3, tensorwise": compute_scale(x, E4M3, "tensorwise", dim=1),
        "e4m3, rowwise": compute_scale(x, E4M3, "rowwise", dim=1),
    }
    print(f"{'how':<18} {'mean relative error':>20} {'values lost to zero':>20}")
    for how, scale in scales.items():
        stored = dequantize(quantize(x, E4M3, scale), scale)
        err = ((stored - x).abs() / x.abs()).mean().item()
        print(f"{how:<18} {err:>20.4f} {int((stored == 0).sum()):>17} / {x.numel()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
# --8<-- [end:main]
