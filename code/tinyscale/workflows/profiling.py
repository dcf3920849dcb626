# --8<-- [start:header]
"""Where a training step's time goes: torch.profiler on the course model's step.

Try it:  python -m tinyscale.workflows.profiling --dropout 0.1

Profiles a few training steps of the Lab model (code/config/config.json) on one process
and prints the operator table, the time grouped by part of the model, and which attention
kernel ran; writes a Chrome/Perfetto trace to runs/profiling/. DDP's all-reduce in the
same kind of trace: tinyscale.workflows.ddp_overlap.
"""

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from tinyscale.core.cli import add_flags, from_args
from tinyscale.core.config import load_model_config
from tinyscale.core.device import select_device
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.core.model import TinyTransformer
from tinyscale.core.training import TrainConfig, make_optimizer

# --8<-- [end:header]


# --8<-- [start:config]
ADAMW = ("for-loop", "foreach", "fused")  # torch.optim.AdamW's three implementations


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProfileConfig:
    batch_size: int = 16  # the Lab's global batch, on one process
    dropout: float | None = None  # None: the config's (0.1)
    adamw: str = "for-loop"  # what torch picks on a CPU when you name none
    warmup: int = 2  # steps before the profiler starts: first-use allocations
    steps: int = 3  # steps profiled
    trace_dir: Path = Path("runs/profiling")
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.adamw not in ADAMW:
            raise UsageError(f"unknown --adamw {self.adamw!r}: use one of {', '.join(ADAMW)}")
        if self.batch_size < 1 or self.steps < 1 or self.warmup < 0:
            raise UsageError(
                "need batch_size >= 1 (--global-batch-size), steps >= 1 (--max-steps) "
                "and warmup >= 0"
            )


Batch = tuple[torch.Tensor, torch.Tensor]  # inputs (B, T) and their next tokens (B, T)


def build(cfg: ProfileConfig) -> tuple[TinyTransformer, torch.optim.AdamW, Batch]:
    """The Lab model, its optimizer (make_optimizer's groups, cfg.adamw's kernels), a batch."""
    torch.manual_seed(0)
    model_cfg = load_model_config()
    if cfg.dropout is not None:
        model_cfg = dataclasses.replace(model_cfg, dropout=cfg.dropout)
    device = select_device(cfg.device)
    model = TinyTransformer(model_cfg).to(device)
    opt = with_kernels(make_optimizer(model, TrainConfig()), cfg.adamw)
    block = model_cfg.max_position_embeddings + 1  # T inputs, and each one's next token
    tokens = torch.randint(0, model_cfg.vocab_size, (cfg.batch_size, block), device=device)
    return model, opt, (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def with_kernels(opt: torch.optim.AdamW, adamw: str) -> torch.optim.AdamW:
    """The same AdamW (groups, lr, betas, weight decay) run by another implementation.

    for-loop: about ten small ops per parameter tensor, one tensor after the other.
    foreach: each op once over a list of tensors. fused: one kernel for the whole update.
    """
    groups = [
        {k: v for k, v in g.items() if k not in ("foreach", "fused")} for g in opt.param_groups
    ]
    kernels = {
        "for-loop": {"foreach": False},
        "foreach": {"foreach": True},
        "fused": {"fused": True},
    }
    return torch.optim.AdamW(groups, **kernels[adamw])


# --8<-- [end:config]


# --8<-- [start:ranges]
# Named ranges around the model's parts; every op inside one is charged to it.
PARTS = {"attn": "attention", "ffn": "mlp", "tok_emb": "embeddings/head",
         "pos_emb": "embeddings/head", "ln_f": "embeddings/head", "lm_head": "embeddings/head"}  # fmt: skip
GROUPS = ("attention", "mlp", "embeddings/head", "dropout", "optimizer", "other")


@contextlib.contextmanager
def labelled(model: torch.nn.Module) -> Iterator[None]:
    """Open a ``record_function`` range around each part's forward, from module hooks.

    The model's code stays as it is: a pre-hook enters the range, a forward hook leaves it.
    """
    open_ranges: dict[torch.nn.Module, Any] = {}

    def enter(label: str, module: torch.nn.Module, args: Any) -> None:
        open_ranges[module] = record_function(label)
        open_ranges[module].__enter__()

    def leave(module: torch.nn.Module, args: Any, output: Any) -> None:
        open_ranges.pop(module).__exit__(None, None, None)

    hooks = []
    for name, module in model.named_modules():
        if label := PARTS.get(name.rsplit(".", 1)[-1]):
            hooks.append(module.register_forward_pre_hook(lambda m, a, lb=label: enter(lb, m, a)))
            hooks.append(module.register_forward_hook(leave))
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: Batch) -> float:
    """One training step, the loss computed inside the head's range."""
    x, y = batch
    with record_function("train_step"):
        logits, _ = model(x)
        with record_function("embeddings/head"):
            loss = TinyTransformer.loss(logits, y)
        loss.backward()  # each backward op is charged to the forward op that made it
        with record_function("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
    return loss.item()


# --8<-- [end:ranges]


# --8<-- [start:profile]
def profile_steps(cfg: ProfileConfig, name: str = "step") -> tuple[Any, list[float], Path]:
    """Profile cfg.steps training steps; return the profiler, the losses and the trace's path."""
    model, opt, batch = build(cfg)
    for _ in range(cfg.warmup):
        train_step(model, opt, batch)
    activities = [ProfilerActivity.CPU]
    if batch[0].is_cuda:
        activities.append(ProfilerActivity.CUDA)  # GPU kernels too, in the same timeline
    with labelled(model), profile(activities=activities, record_shapes=True) as prof:
        losses = [train_step(model, opt, batch) for _ in range(cfg.steps)]
    return prof, losses, write_trace(prof, cfg.trace_dir / f"{name}.json")


def write_trace(prof: Any, path: Path) -> Path:
    """Export the Chrome/Perfetto trace atomically: a temp file, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    prof.export_chrome_trace(str(tmp))
    tmp.replace(path)
    return path


# --8<-- [end:profile]


# --8<-- [start:group]
DROPOUT_OPS = ("aten::dropout", "aten::native_dropout", "aten::feature_dropout")
BACKWARD = "autograd::engine::evaluate_function: "


def group_of(event: Any, forward_groups: dict[int, str]) -> str:
    """The part an event's own time belongs to: the innermost range or op that names one."""
    while event is not None:
        if event.name in DROPOUT_OPS:
            return "dropout"  # dropout inside attention (the math path) counts as dropout
        if event.name in GROUPS:  # one of our ranges
            return event.name
        if event.name.startswith(BACKWARD):  # a backward op: its forward op's part
            return forward_groups.get(event.sequence_nr, "other")
        event = event.cpu_parent
    return "other"  # train_step's own time: Python between the ops


def grouped_times(prof: Any) -> dict[str, float]:
    """Self CPU time (µs) per part. The parts sum to the table's total self CPU time.

    Autograd numbers every op it records in the forward (``sequence_nr``) and its backward
    node carries the same number: that links a backward op to the range of its forward op.
    """
    events = prof.events()
    forward_groups: dict[int, str] = {}
    for event in events:
        if event.sequence_nr >= 0 and not event.name.startswith(BACKWARD):
            forward_groups.setdefault(event.sequence_nr, group_of(event, {}))
    times = dict.fromkeys(GROUPS, 0.0)
    for event in events:
        times[group_of(event, forward_groups)] += event.self_cpu_time_total
    return times


def attention_kernel(prof: Any) -> str:
    """Which path F.scaled_dot_product_attention took, read from the op names."""
    names = {event.key for event in prof.key_averages()}
    for op, path in (("aten::_scaled_dot_product_flash_attention_for_cpu", "fused (flash, CPU)"),
                     ("aten::_scaled_dot_product_flash_attention", "fused (flash, CUDA)"),
                     ("aten::_scaled_dot_product_efficient_attention", "fused (efficient)"),
                     ("aten::_scaled_dot_product_attention_math", "math (unfused)")):  # fmt: skip
        if op in names:
            return path
    raise LookupError("no scaled_dot_product_attention op in the profile")


def share_of(prof: Any, ops: Sequence[str]) -> float:
    """The fraction of all self CPU time spent in the named ops (e.g. the matmuls)."""
    table = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in table)
    return sum(e.self_cpu_time_total for e in table if e.key in ops) / total


def ops_in(prof: Any, part: str) -> tuple[int, int]:
    """aten ops of a part: those its Python code called, and all, counting the ops they run."""
    ops = [e for e in prof.events() if e.name.startswith("aten::") and group_of(e, {}) == part]
    called = [e for e in ops if not e.cpu_parent.name.startswith("aten::")]
    return len(called), len(ops)


MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")
RNG = ("aten::bernoulli_",)


# --8<-- [end:group]


# --8<-- [start:report]
def report(cfg: ProfileConfig, rows: int = 8) -> list[str]:
    """The operator table, the parts, the shares the findings are about, the trace's path."""
    prof, _, trace = profile_steps(cfg)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)
    times = grouped_times(prof)
    total = sum(times.values())
    lines = [table, "where the time goes (self CPU time, forward and backward together):"]
    lines += [f"  {part:<16} {100 * t / total:5.1f} %" for part, t in times.items()]
    lines += [
        f"matmuls (mm, addmm, bmm): {100 * share_of(prof, MATMULS):.1f} % of the time",
        f"dropout's random numbers (bernoulli_): {100 * share_of(prof, RNG):.1f} %",
        f"attention kernel: {attention_kernel(prof)}",
        f"trace: {trace} (open it in ui.perfetto.dev or chrome://tracing)",
    ]
    return lines


# --8<-- [end:report]


# --8<-- [start:main]
# The flags a training script has for the same things (tinyscale.core.cli): the batch, the
# steps, the device. Here they default to the Lab's batch, 3 steps, and the CPU.
DEFAULTS = TrainConfig(device="cpu", max_steps=ProfileConfig.steps)
FLAGS = ("global_batch_size", "max_steps", "device")


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    add_flags(parser, DEFAULTS, FLAGS, notes={"max_steps": "here: the steps profiled"})
    parser.add_argument("--dropout", type=float, default=None, help="default: the config's")
    parser.add_argument("--adamw", default="for-loop", help=", ".join(ADAMW))
    parser.add_argument("--trace-dir", type=Path, default=ProfileConfig.trace_dir)
    args = parser.parse_args(argv)
    train = from_args(DEFAULTS, args)  # every TrainConfig flag is checked here
    cfg = ProfileConfig(dropout=args.dropout, adamw=args.adamw, trace_dir=args.trace_dir,
                        batch_size=train.global_batch_size, steps=train.max_steps,
                        device=train.device)  # fmt: skip
    for line in report(cfg):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
# --8<-- [end:main]
