# --8<-- [start:autocast]
"""Mixed precision: autocast for the forward pass, and a dynamic loss scaler for fp16.

The scaler is written from scratch with plain tensor operations, after Micikevicius et al.,
"Mixed Precision Training", ICLR 2018 (arXiv:1710.03740), Section 3.2 "Loss scaling";
``tests/tinyscale/core/test_precision.py`` proves it matches ``torch.amp.GradScaler`` step by step.

Try it:  python -c "from tinyscale.core.precision import DynamicLossScaler as S; print(S().get_scale())"
"""

import contextlib

import torch

from tinyscale.core.errors import UsageError

# The course's one word per precision, used by every script, formula and config of it:
#   fp32  everything in float32
#   bf16  mixed precision: matmuls in bfloat16, fp32 master weights and optimizer state
#   fp16  the same with float16, which also needs a loss scaler (and a GPU)
#   fp8-<recipe>  (Week 3, tinyscale.low_precision) the linear layers' matmuls in float8,
#         e4m3 forward and e5m2 for gradients, scaled tensorwise, rowwise or delayed
PRECISIONS = ("fp32", "bf16", "fp16")
# The same choice in the libraries' own words, so that no name means two things:
ACCELERATE_NAMES = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}  # Accelerator(mixed_precision=)
DEEPSPEED_BLOCKS = ("bf16", "fp16")  # a DeepSpeed JSON enables one of these blocks, or neither


def check_precision(precision: str) -> str:
    """``precision`` if it is one of ``PRECISIONS``; else one line that lists them."""
    if precision not in PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    return precision


def autocast_context(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The context to run the forward pass (and the loss) in, for one of ``PRECISIONS``.

    Autocast keeps the weights in fp32 and casts per operation: matmuls and convolutions
    run in the low-precision dtype; reductions, softmax, norms and losses stay in fp32.
    """
    if check_precision(precision) == "fp32":
        return contextlib.nullcontext()
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"{precision} autocast runs on cpu or cuda, not {device.type}; use fp32")
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if device.type != "cuda":  # fp16: CPU matmuls in fp16 are slow and need a loss scaler
        raise UsageError(f"fp16 needs a CUDA GPU (device is {device.type}); use bf16 on CPU")
    return torch.autocast("cuda", dtype=torch.float16)


def make_scaler(device: torch.device, precision: str) -> "DynamicLossScaler | None":
    """A loss scaler for fp16 only: bf16 has fp32's exponent range, so its gradients fit."""
    autocast_context(device, precision)  # the same checks, the same one-line errors
    return DynamicLossScaler() if precision == "fp16" else None


# --8<-- [end:autocast]


# --8<-- [start:scaler_init]
class DynamicLossScaler:
    """Scale the loss up so small fp16 gradients do not flush to zero; undo it before the step.

    Dynamic: if a step overflows (an inf or nan in any gradient), skip that step and halve
    the scale; after ``growth_interval`` clean steps in a row, double it. Same defaults,
    same order of operations and same state as ``torch.amp.GradScaler``.
    """

    def __init__(
        self,
        *,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ) -> None:
        if not (growth_factor > 1.0 and 0.0 < backoff_factor < 1.0 and growth_interval >= 1):
            raise UsageError("need growth_factor > 1, 0 < backoff_factor < 1, growth_interval >= 1")
        self._scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._growth_tracker = 0  # clean steps in a row since the last growth or overflow
        # Per optimizer, this step: did its gradients hold an inf/nan? (absent: not unscaled)
        self._found_inf: dict[int, bool] = {}

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """loss x S: every gradient of the backward pass comes out S times larger."""
        return loss * self._scale

    # --8<-- [end:scaler_init]

    # --8<-- [start:scaler_unscale]
    def unscale_(self, optimizer: torch.optim.Optimizer) -> bool:
        """Divide every gradient by S in place; return True if any is inf or nan.

        Call it yourself before gradient clipping (clip the true gradients, not the
        scaled ones); ``step`` calls it otherwise. At most once per optimizer per step:
        a second division would shrink the gradients S times too much.
        """
        if id(optimizer) in self._found_inf:
            raise RuntimeError("unscale_() was already called for this step; call update() first")
        # float32 reciprocal, as GradScaler computes it, so the two agree to the bit
        inv_scale = torch.tensor(self._scale, dtype=torch.float32).reciprocal()
        found = torch.zeros(())
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.dtype == torch.float16:
                    raise UsageError("gradients are fp16; keep fp32 weights and let autocast cast")
                p.grad.mul_(inv_scale.to(p.grad.device))
                # One flag on the device, read once below: no GPU->CPU sync per parameter.
                found += (~torch.isfinite(p.grad)).any().to(found.device)
        self._found_inf[id(optimizer)] = bool(found.item())
        return self._found_inf[id(optimizer)]

    # --8<-- [end:scaler_unscale]

    # --8<-- [start:scaler_step]
    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Unscale (if not done yet), then step only if every gradient is finite."""
        if id(optimizer) not in self._found_inf:
            self.unscale_(optimizer)
        if self._found_inf[id(optimizer)]:
            return False  # skipped: the weights keep their values, the scale backs off
        optimizer.step()
        return True

    def update(self) -> None:
        """Pick the scale for the next step from what this step found."""
        if not self._found_inf:
            raise RuntimeError("update() before step(): no gradients were checked this step")
        if any(self._found_inf.values()):
            self._scale *= self._backoff_factor  # overflow: back off ...
            self._growth_tracker = 0  # ... and start counting clean steps again
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self._growth_interval:
                grown = self._scale * self._growth_factor
                if grown <= torch.finfo(torch.float32).max:  # the scale itself must stay finite
                    self._scale = grown
                self._growth_tracker = 0
        self._found_inf.clear()

    # --8<-- [end:scaler_step]

    # --8<-- [start:scaler_state]
    def state_dict(self) -> dict[str, float | int]:
        """What a checkpoint needs to resume with the same scale (GradScaler's keys)."""
        return {
            "scale": self._scale,
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._growth_tracker,
        }

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        self._scale = float(state["scale"])
        self._growth_factor = float(state["growth_factor"])
        self._backoff_factor = float(state["backoff_factor"])
        self._growth_interval = int(state["growth_interval"])
        self._growth_tracker = int(state["_growth_tracker"])


# --8<-- [end:scaler_state]
