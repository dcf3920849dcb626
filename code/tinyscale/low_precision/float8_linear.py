# --8<-- [start:header]
"""Float8Linear from scratch: every matmul of a linear layer in fp8, forward and backward.

Launch:  python -m tinyscale.low_precision.float8_linear

A linear layer does three matmuls per step: the output in the forward pass, and in the
backward pass the gradient of its input and of its weight. Each one here quantizes both
operands (weights and activations to e4m3, output gradients to e5m2), multiplies them
with ``torch._scaled_mm``, which takes the two scales and returns float32, and hands
float32 on. The weights themselves stay float32 ("master weights"), and so does the
optimizer: fp8 exists only inside the matmuls. On an H100 the fp8 tensor cores have twice
the peak rate of bf16 (NVIDIA's data sheet); on a CPU ``_scaled_mm`` is a reference
kernel, so here fp8 shows its numerics, not its speed.
"""

from collections.abc import Sequence

import torch
from torch import nn

from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.low_precision.scaling import E4M3, E5M2, DelayedScaling, compute_scale, quantize

RECIPES = ("tensorwise", "rowwise", "delayed", "unscaled")

# --8<-- [end:header]


# --8<-- [start:matmul]
def fp8_matmul(
    a: torch.Tensor, b: torch.Tensor, a_dtype: torch.dtype, b_dtype: torch.dtype,
    scale_a: torch.Tensor, scale_b: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """a @ b with both operands cast to fp8 after scaling, result in float32."""
    qa, qb = quantize(a, a_dtype, scale_a), quantize(b, b_dtype, scale_b)
    # On a GPU, cuBLASLt takes a row-major left operand and a column-major right one (the
    # CPU kernel takes any layout), the scales on the data's device, and, with rowwise
    # scales, writes bf16 only. None of this changes a value on the CPU.
    qa, qb = qa.contiguous(), qb.t().contiguous().t()
    rowwise_on_gpu = a.is_cuda and scale_a.numel() > 1
    # _scaled_mm multiplies by the scales it is given: the inverse of ours (dequantization)
    return torch._scaled_mm(
        qa, qb, scale_a=(1 / scale_a).float().contiguous().to(a.device),
        scale_b=(1 / scale_b).float().contiguous().to(a.device),
        out_dtype=torch.bfloat16 if rowwise_on_gpu else torch.float32,
    ).float()  # fmt: skip


# --8<-- [end:matmul]


# --8<-- [start:function]
class _Float8LinearFn(torch.autograd.Function):
    """y = x @ w.T; dx = dy @ w; dw = dy.T @ x: each in fp8, dy in e5m2, x and w in e4m3.

    A scale follows the dimension its matmul sums over (rowwise: one per row of the left
    operand, one per column of the right one), so a tensor used in two matmuls may need
    two sets of rowwise scales; one per-tensor scale serves both.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, layer: "Float8Linear") -> torch.Tensor:
        s_x = layer.scale("x", x, E4M3, dim=1)
        s_w = layer.scale("w", weight.t(), E4M3, dim=0)
        ctx.save_for_backward(x, weight, s_x, s_w)
        ctx.layer = layer
        return fp8_matmul(x, weight.t(), E4M3, E4M3, s_x, s_w)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, s_x, s_w = ctx.saved_tensors
        layer = ctx.layer
        s_dy = layer.scale("dy", grad_out, E5M2, dim=1)
        grad_x = fp8_matmul(grad_out, weight, E5M2, E4M3, s_dy,
                            layer.again(weight, E4M3, dim=0, scale=s_w.t()))  # fmt: skip
        grad_w = fp8_matmul(grad_out.t(), x, E5M2, E4M3,
                            layer.again(grad_out.t(), E5M2, dim=1, scale=s_dy.t()),
                            layer.again(x, E4M3, dim=0, scale=s_x.t()))  # fmt: skip
        return grad_x, grad_w, None


# --8<-- [end:function]


# --8<-- [start:layer]
class Float8Linear(nn.Linear):
    """nn.Linear whose three matmuls run in fp8; weights, bias and gradients stay float32.

    recipe: tensorwise or rowwise (scales from the current amax), delayed (per tensor, from
    an amax history of ``history`` steps, with ``margin``), or unscaled (a plain cast:
    what fp8 does without scaling).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 recipe: str = "tensorwise", history: int = 16, margin: int = 0) -> None:  # fmt: skip
        super().__init__(in_features, out_features, bias=bias)
        if recipe not in RECIPES:
            raise UsageError(f"unknown fp8 recipe {recipe!r}: use one of {', '.join(RECIPES)}")
        self.recipe = recipe
        self.histories = {name: DelayedScaling(history, margin) for name in ("x", "w", "dy")}

    def scale(self, name: str, t: torch.Tensor, dtype: torch.dtype, dim: int) -> torch.Tensor:
        """The scale of operand ``name`` (x, w or dy) for a matmul summing over ``dim``."""
        if self.recipe == "unscaled":
            return torch.tensor(1.0)
        if self.recipe == "delayed":
            return self.histories[name].scale(t, dtype)
        return compute_scale(t, dtype, self.recipe, dim)

    def again(
        self, t: torch.Tensor, dtype: torch.dtype, dim: int, scale: torch.Tensor
    ) -> torch.Tensor:
        """The scale of a tensor in its second matmul: the same one, unless rowwise."""
        return compute_scale(t, dtype, "rowwise", dim) if self.recipe == "rowwise" else scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        y = _Float8LinearFn.apply(flat, self.weight, self).reshape(*x.shape[:-1], -1)
        return y + self.bias if self.bias is not None else y


def convert_to_float8(
    model: nn.Module, *, recipe: str = "tensorwise", skip: Sequence[str] = ("lm_head",)
) -> nn.Module:
    """Swap every nn.Linear of ``model`` for a Float8Linear holding the same parameters (in
    place; shared weights stay shared). ``skip`` keeps layers in high precision: by
    default the output layer, whose logits go straight into the softmax (and whose weight
    the course model ties to the embedding), as torchao and torchtitan do."""
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is nn.Linear and full not in skip:
                fp8 = Float8Linear(child.in_features, child.out_features, child.bias is not None,
                                   recipe=recipe)  # fmt: skip
                fp8.weight, fp8.bias = child.weight, child.bias
                setattr(module, child_name, fp8)
    return model


# --8<-- [end:layer]


# --8<-- [start:torchao]
def differences_from_torchao(*, seed: int = 0) -> dict[str, float]:
    """Our tensorwise Float8Linear against torchao's Float8Linear (its default recipe,
    tensorwise, emulated: the CPU has no fp8 tensor cores) on the same weights, inputs and
    output gradient: the largest difference of each result, relative to its largest value."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    torch.manual_seed(seed)
    ours = Float8Linear(256, 128, recipe="tensorwise")
    reference = nn.Sequential(nn.Linear(256, 128))
    reference[0].load_state_dict(ours.state_dict())
    theirs = convert_to_float8_training(reference, config=Float8LinearConfig(emulate=True))
    x, dy = torch.randn(64, 256, requires_grad=True), torch.randn(64, 128) * 1e-2
    results = {}
    for name, layer, weight in (("ours", ours, ours.weight), ("torchao", theirs, theirs[0].weight)):
        y = layer(x)
        results[name] = (y, *torch.autograd.grad(y, (x, weight), dy))
    return {
        what: ((a - b).abs().max() / b.abs().max()).item()
        for what, a, b in zip(
            ("output", "grad input", "grad weight"), *results.values(), strict=True
        )
    }


# --8<-- [end:torchao]


# --8<-- [start:main]
def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    x = torch.randn(64, 256, requires_grad=True)
    ref = nn.Linear(256, 128)
    print(
        f"{'recipe':<11} {'output':>8} {'grad input':>11} {'grad weight':>12}   (relative error vs fp32)"
    )
    y_ref = ref(x)
    dy = torch.randn_like(y_ref)
    dx_ref, dw_ref = torch.autograd.grad(y_ref, (x, ref.weight), dy)
    for recipe in RECIPES:
        layer = Float8Linear(256, 128, recipe=recipe)
        layer.load_state_dict(ref.state_dict())
        y = layer(x)
        dx, dw = torch.autograd.grad(y, (x, layer.weight), dy)
        errs = [
            ((a - b).norm() / b.norm()).item() for a, b in ((y, y_ref), (dx, dx_ref), (dw, dw_ref))
        ]
        print(f"{recipe:<11} {errs[0]:>8.4f} {errs[1]:>11.4f} {errs[2]:>12.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
# --8<-- [end:main]
