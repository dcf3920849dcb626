# --8<-- [start:header]
"""A parallelism planner: the course's formulas, asked which layout a model needs on a cluster.

    python -m tinyscale.composed.planner --model 7b --gpus 16 --seq-len 8192 --global-batch 16

For every layout (data x context x pipeline x tensor, a ZeRO stage, micro-batches) that the model
(a core.config preset) and the cluster allow, it adds up what the lessons measured: model
states per GPU (the ZeRO formulas of Week 2, on the TP shard of Week 4), saved activations
(the memory calculator, with tensor and sequence parallelism, and with ``--recompute`` the
recomputation of Week 5), the pipeline bubble (Week 3), the FLOPs of a step (core.flops:
6 N + 12 L T d per token, as Profiling and MFU counts them, plus what recomputation runs
again), and the bytes each group sends per step (tensor: activations; pipeline: stage
boundaries; data: parameters; context: the ring's keys and values, Week 5). It keeps
the layouts that fit in memory (at the smallest context-parallel degree that fits) and
ranks them by a step time made of three assumptions, each stated: compute at the GPU's
peak, tensor, context and pipeline messages on the critical path, data-parallel messages
hidden behind compute when they can be. A sketch of what planners in Megatron-LM and torchtitan's docs reason about,
not a replacement for measuring.
"""

import dataclasses
import math
from collections.abc import Sequence

from tinyscale.comm.parallel_layout import ParallelLayout
from tinyscale.composed.two_d import tensor_step_bytes
from tinyscale.context_parallel.allgather_kv import sent_bytes_formula
from tinyscale.core.cli import flag
from tinyscale.core.config import PRESETS, ModelConfig, preset
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.core.flops import flops_per_token
from tinyscale.core.memory import human_bytes
from tinyscale.core.model import count_parameters
from tinyscale.core.recompute import RECOMPUTE, check_recompute, recompute_flops_per_token
from tinyscale.data_parallel.memory_calculator import (
    activation_bytes_estimate,
    activation_element_bytes,
    activation_peak_bytes,
    zero_state_bytes,
    zero_step_bytes,
)
from tinyscale.pipeline_parallel.schedules import bubble_fraction
from tinyscale.tensor_parallel.tp_model import parameters_per_rank

# --8<-- [end:header]


# --8<-- [start:inputs]
@dataclasses.dataclass(frozen=True, kw_only=True)
class Cluster:
    gpus: int
    gpus_per_node: int = 8
    memory_gb: float = 80.0  # H100 SXM
    usable: float = 0.85  # the rest: CUDA context, NCCL buffers, fragmentation
    peak_tflops: float = 989.0  # dense bf16, H100 SXM
    intra_gbs: float = 450.0  # NVLink, GB/s each way per GPU
    inter_gbs: float = 50.0  # one 400 Gb/s InfiniBand NIC per GPU

    def __post_init__(self) -> None:
        for name in ("gpus", "gpus_per_node"):
            at_least_one(name, getattr(self, name))
        for name in ("memory_gb", "usable", "peak_tflops", "intra_gbs", "inter_gbs"):
            value, share = getattr(self, name), name == "usable"  # usable: a share, up to 1
            if not (value > 0 and math.isfinite(value)) or (share and value > 1):
                what = "in (0, 1]" if share else "a positive number"
                raise UsageError(f"{label(name)} must be {what}, got {value}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload:
    model: ModelConfig
    seq_len: int
    global_batch: int  # sequences per optimizer step
    micro_batch: int = 1  # sequences per forward/backward on one GPU
    precision: str = "bf16"
    recompute: str = "none"  # or "selective" (the attention core) or "full" (every block)

    def __post_init__(self) -> None:
        for name in ("seq_len", "global_batch", "micro_batch"):
            at_least_one(name, getattr(self, name))
        check_recompute(self.recompute)
        if self.seq_len > self.model.max_position_embeddings:
            raise UsageError(f"--seq-len {self.seq_len} is longer than the model's "
                             f"{self.model.max_position_embeddings} positions: lower it, "
                             "or raise --max-positions")  # fmt: skip


FLAGS = (
    "gpus",
    "gpus_per_node",
    "memory_gb",
    "seq_len",
    "global_batch",
    "max_positions",
)  # main's flags


def label(name: str) -> str:
    """A field as the reader set it: its flag, or its name where no flag sets it."""
    return flag(name) if name in FLAGS else name


def at_least_one(name: str, value: int) -> None:
    if value < 1:
        raise UsageError(f"{label(name)} must be a whole number >= 1, got {value}")


@dataclasses.dataclass(frozen=True)
class Plan:
    layout: ParallelLayout  # ZeRO-3 shards over dp_shard (FSDP), ZeRO 0-2 over dp_replicate
    zero: int
    microbatches: int  # per data-parallel replica per step
    params: int  # per GPU, before ZeRO: the busiest pipeline stage's TP shard
    states: int  # bytes: weights + gradients + optimizer, after ZeRO
    activations: int  # bytes, the micro-batches a first stage holds (1F1B)
    bubble: float
    tensor_bytes: float  # per GPU per step
    pipeline_bytes: float
    data_bytes: float
    context_bytes: float  # the ring's keys and values, and their gradients (0 when cp = 1)
    step_s: float  # the time model below

    @property
    def memory(self) -> int:
        return self.states + self.activations

    @property
    def dp(self) -> int:
        return self.layout.data_parallel

    @property
    def cp(self) -> int:
        return self.layout.cp

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def pp(self) -> int:
        return self.layout.pp


# --8<-- [end:inputs]


# --8<-- [start:evaluate]
def evaluate(w: Workload, c: Cluster, layout: ParallelLayout, *, zero: int) -> Plan:
    """One layout's memory, bubble, bytes and step time, from the course's formulas."""
    cfg, dp, cp, tp, pp = w.model, layout.data_parallel, layout.cp, layout.tp, layout.pp
    stage = dataclasses.replace(cfg, num_hidden_layers=math.ceil(cfg.num_hidden_layers / pp))
    m = w.global_batch // (dp * w.micro_batch)  # micro-batches per replica per step
    e = activation_element_bytes(w.precision)  # also per gradient sent: the same dtype
    params = parameters_per_rank(stage, tp)  # the busiest stage: its blocks and embeddings
    shards = dp * cp  # a cp group's ranks hold the same weights: gradients sum over dp x cp
    states = zero_state_bytes(params, stage=zero, world_size=shards, precision=w.precision).total
    t = w.seq_len // cp  # the positions each rank holds (head-tail: 2 chunks of T / 2cp)
    shape = dict(micro_batch=w.micro_batch, seq_len=t, precision=w.precision,
                 tensor_parallel=tp, sequence_parallel=tp > 1, recompute=w.recompute)  # fmt: skip
    acts = activation_bytes_estimate(stage, **shape)  # what one micro-batch keeps
    again = activation_peak_bytes(stage, **shape) - acts  # what recomputation brings back
    kv = w.micro_batch * t * cfg.hidden_size // tp * e  # one rank's k (= its v), one layer
    # the ring's backward holds five (k, v) blocks at once: the one it works on, the next
    # arriving, its gradient share, the last share still going out, the sum coming in
    ring = 0 if cp == 1 else 5 * 2 * kv
    activations = acts * min(m, pp) + again + ring  # 1F1B: the first stage holds up to pp
    bubble = float(bubble_fraction(pp, m))  # 1F1B's (p - 1) / (m + p - 1)
    tensor = 0.0 if tp == 1 else m * tensor_step_bytes(
        stage, batch=w.micro_batch, seq_len=t, tp=tp, element_size=e)  # fmt: skip
    boundary = w.micro_batch * t * cfg.hidden_size * e / tp  # SP: 1/tp of it per GPU
    pipeline = 0.0 if pp == 1 else 2 * m * boundary  # forward activations, backward gradients
    data = zero_step_bytes(stage=zero, numel=params, world=shards, bytes_per_element=e)
    forward, backward = sent_bytes_formula("ring", cp, kv)  # one layer, one micro-batch
    rerun = forward if w.recompute != "none" else 0  # recomputation runs the ring again
    context = float(m * stage.num_hidden_layers * (forward + backward + rerun))
    # the time model: compute at peak (plus the forward that recomputation runs again),
    # stretched by the bubble; tensor and pipeline messages wait; data-parallel ones hide
    tokens = w.global_batch * w.seq_len
    again_flops = recompute_flops_per_token(cfg, w.seq_len, w.recompute)
    flops = (flops_per_token(cfg, w.seq_len) + again_flops) * tokens
    compute = flops / (c.gpus * c.peak_tflops * 1e12) / (1 - bubble)
    spans = dp * cp * tp * pp > c.gpus_per_node  # the data group leaves the node
    exposed = max(0.0, data / ((c.inter_gbs if spans else c.intra_gbs) * 1e9) - compute)
    pipe_gbs = c.inter_gbs if cp * tp * pp > c.gpus_per_node else c.intra_gbs
    ring_gbs = c.inter_gbs if cp * tp > c.gpus_per_node else c.intra_gbs  # cp just outside tp
    step = (
        compute
        + tensor / (c.intra_gbs * 1e9)
        + pipeline / (pipe_gbs * 1e9)
        + exposed
        + context / (ring_gbs * 1e9)
    )  # the ring waited on, as tensor messages are
    return Plan(layout, zero, m, params, states, activations, bubble, tensor, pipeline, data,
                context, step)  # fmt: skip


# --8<-- [end:evaluate]


# --8<-- [start:plan]
def splits(w: Workload, c: Cluster) -> list[tuple[int, int, int, int]]:
    """Every (dp, cp, tp, pp) whose product is the GPUs, as the model and the nodes allow."""
    cfg, found = w.model, []
    for tp in (1, 2, 4, 8, 16):
        fits_heads = cfg.num_attention_heads % tp == 0 and cfg.vocab_size % tp == 0
        if tp > c.gpus_per_node or c.gpus % tp or not fits_heads:
            continue  # tensor groups stay inside a node and split the heads evenly
        # cp sits just outside tp (torchtitan's order) and may leave the node: its ring
        # sends one layer's keys and values per hop, far less often than tp's every
        # matmul, so a cp group wider than a node runs, on the network (ring_gbs below)
        for cp in (1, 2, 4, 8):
            if c.gpus % (tp * cp) or (cp > 1 and w.seq_len % (2 * cp)):
                continue  # head-tail: every rank takes two equal chunks of the sequence
            for pp in (1, 2, 4, 8, 16, 32):
                if c.gpus % (tp * cp * pp) or pp > cfg.num_hidden_layers:
                    continue
                found.append((c.gpus // (tp * cp * pp), cp, tp, pp))
    return found  # never empty: dp = every GPU, cp = tp = pp = 1


def layouts(w: Workload, c: Cluster) -> list[tuple[ParallelLayout, int]]:
    """Every (layout, ZeRO stage) the model and the cluster allow."""
    found = []
    for dp, cp, tp, pp in splits(w, c):
        if w.global_batch % (dp * w.micro_batch):
            continue  # every replica gets whole micro-batches
        for zero in (0, 1, 2, 3):
            if pp > 1 and zero > 1:
                continue  # gradients accumulate over micro-batches: stages keep them whole
            data = {"dp_shard" if zero == 3 else "dp_replicate": dp}  # ZeRO-3 is FSDP's axis
            found.append((ParallelLayout(pp=pp, cp=cp, tp=tp, **data), zero))
    return found


def plan(w: Workload, c: Cluster) -> list[Plan]:
    """The layouts that fit, fastest first (then the least memory), at the smallest cp that
    fits: cp splits the compute evenly and adds the ring's bytes, so it buys memory only,
    and the planner grows it only as far as memory needs (as Megatron-LM advises)."""
    found = layouts(w, c)
    if not found:  # not memory: the batch does not split over any layout's replicas
        sizes = sorted({dp * w.micro_batch for dp, _, _, _ in splits(w, c)})
        fit = min(-(-w.global_batch // n) * n for n in sizes)  # the next batch one divides
        raise UsageError(
            f"no layout of {c.gpus} GPUs takes --global-batch {w.global_batch}: their "
            f"data-parallel sizes ({', '.join(map(str, sizes))}) do not divide it, so replicas "
            f"would get unequal batches; use e.g. --global-batch {fit}, or other --gpus"
        )
    budget = c.memory_gb * 1e9 * c.usable
    plans = [evaluate(w, c, layout, zero=zero) for layout, zero in found]
    fitting = [p for p in plans if p.memory <= budget]
    if fitting:
        fitting = [p for p in fitting if p.cp == min(f.cp for f in fitting)]
    else:
        least = human_bytes(min(p.memory for p in plans))
        raise UsageError(
            f"no layout fits in {c.memory_gb:g} GB x {c.usable:g}; the smallest needs {least} "
            "per GPU: raise --gpus or --memory-gb, add --recompute full, or lower --seq-len"
        )
    return sorted(fitting, key=lambda p: (round(p.step_s, 3), p.memory))


# --8<-- [end:plan]


# --8<-- [start:main]
def describe(p: Plan) -> str:
    cp, ring = (f" x cp {p.cp}", f" + {human_bytes(p.context_bytes)} CP") if p.cp > 1 else ("", "")
    return (
        f"dp {p.dp:>2}{cp} x tp {p.tp} x pp {p.pp}, ZeRO-{p.zero}, m {p.microbatches:>3}: "
        f"{human_bytes(p.memory):>9} per GPU (states {human_bytes(p.states)}, "
        f"activations {human_bytes(p.activations)}), bubble {p.bubble:.0%}, "
        f"sends {human_bytes(p.tensor_bytes)} TP + {human_bytes(p.pipeline_bytes)} PP + "
        f"{human_bytes(p.data_bytes)} DP{ring}, step {p.step_s:.2f} s"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(description="Propose (DP, TP, PP, ZeRO stage, micro-batches).")
    parser.add_argument("--model", choices=PRESETS, default="7b", help="a core.config preset")
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--memory-gb", type=float, default=80.0)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--max-positions", type=int, default=None,
                        help="the model's position table (default: the preset's); raise it "
                             "to plan sequences longer than the preset's")  # fmt: skip
    parser.add_argument("--global-batch", type=int, required=True, help="sequences per step")
    parser.add_argument("--recompute", choices=RECOMPUTE, default="none",
                        help="run again in backward: the attention core or every block")  # fmt: skip
    parser.add_argument("--top", type=int, default=3)
    args = parser.parse_args(argv)
    if args.top < 1:
        raise UsageError(f"--top must be a whole number >= 1, got {args.top}")
    if args.max_positions is not None:
        at_least_one("max_positions", args.max_positions)
    longer = {} if args.max_positions is None else {"max_position_embeddings": args.max_positions}
    w = Workload(model=preset(args.model, **longer), seq_len=args.seq_len,
                 global_batch=args.global_batch, recompute=args.recompute)  # fmt: skip
    c = Cluster(gpus=args.gpus, gpus_per_node=args.gpus_per_node, memory_gb=args.memory_gb)
    plans = plan(w, c)
    print(f"{args.model}: {count_parameters(w.model) / 1e9:.1f} B parameters, {c.gpus} GPUs, "
          f"{len(plans)} layouts fit; the fastest:")  # fmt: skip
    for p in plans[: args.top]:
        print("  " + describe(p))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))

# --8<-- [end:main]
