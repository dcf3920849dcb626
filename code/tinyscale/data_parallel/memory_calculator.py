# --8<-- [start:header]
"""Bytes per rank for a model config, a precision, a world size and a ZeRO stage.

    python -m tinyscale.data_parallel.memory_calculator --config code/config/config.json \\
        --precision bf16 --world-size 4 --stage 2 --micro-batch 8

Model states follow the ZeRO paper (Rajbhandari et al. 2020, arXiv:1910.02054, §3.1 and
Figure 1): K bytes per parameter of optimizer state, divided by N from stage 1, the
gradients from stage 2, the weights at stage 3. Activations are counted for
TinyTransformer, tensor by tensor, from what its forward saves for backward.
"""

import dataclasses
from collections.abc import Sequence

from tinyscale.core.config import ModelConfig, load_model_config
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.core.memory import RECIPES, StateBytes, human_bytes
from tinyscale.core.model import count_parameters
from tinyscale.core.precision import PRECISIONS, check_precision
from tinyscale.core.recompute import check_recompute
from tinyscale.data_parallel.zero import check_zero_stage

# --8<-- [end:header]


# --8<-- [start:states]
def check_shard_size(world_size: int, shard_size: int | None) -> int:
    """The ranks of one shard group: all of them (FSDP, ZeRO), or a divisor of the world (HSDP)."""
    shard = world_size if shard_size is None else shard_size
    if shard < 1 or world_size % shard:
        raise UsageError(
            f"--shard-size {shard} does not divide --world-size {world_size}: hybrid sharding "
            "(HSDP) needs groups of equal size (e.g. the GPUs of one node)"
        )
    return shard


def zero_state_bytes(
    num_params: float, *, stage: int, world_size: int, precision: str = "fp32",
    shard_size: int | None = None,
) -> StateBytes:  # fmt: skip
    """Model-state bytes one rank holds: (weights, gradients, optimizer) / N where sharded.

    fp32:        4Ψ + 4Ψ + 8Ψ  (Adam's two moments)
    bf16, fp16:  2Ψ + 2Ψ + 12Ψ (fp32 master weights and moments): the paper's 16Ψ,
    so ZeRO-1 = 4Ψ + 12Ψ/N, ZeRO-2 = 2Ψ + 14Ψ/N, ZeRO-3 = 16Ψ/N.

    Hybrid sharding (HSDP) shards over groups of `shard_size` ranks and replicates across
    the world_size / shard_size groups: divide by the group size, not by N.
    """
    check_zero_stage(stage)
    check_precision(precision)
    if world_size < 1:
        raise UsageError(f"world size must be at least 1, got {world_size}")
    n = check_shard_size(world_size, shard_size)
    weights, grads, optimizer = RECIPES[precision]
    return StateBytes(
        params=round(weights * num_params / (n if stage >= 3 else 1)),
        grads=round(grads * num_params / (n if stage >= 2 else 1)),
        optimizer=round(optimizer * num_params / (n if stage >= 1 else 1)),
    )


# --8<-- [end:states]


# --8<-- [start:traffic]
def zero_traffic(stage: int, *, shared: float = 0.0) -> float:
    """Elements each rank moves per step, in units of Ψ: the paper's communication volume.

    DDP and ZeRO-1/2: the gradients are reduce-scattered (Ψ) and the updated weights
    all-gathered (Ψ) — an all-reduce, split in its two halves. ZeRO-3 all-gathers the
    weights before the forward pass and again before the backward pass: 3Ψ (§7.2). A
    weight used twice per pass (``shared``, a fraction of Ψ: a tied embedding) is
    gathered twice per pass when ZeRO-3 frees every weight right after its use.
    """
    return 3 + 2 * shared if check_zero_stage(stage) == 3 else 2


def zero_step_bytes(*, stage: int, numel: int, world: int, bytes_per_element: int = 4) -> float:
    """Bytes one rank sends per step with ring algorithms: (N-1)/N of the paper's volume.

    The paper's 2Ψ and 3Ψ are the large-N limits; a ring sends (N-1)/N of the data per pass.
    """
    return zero_traffic(stage) * (world - 1) / world * numel * bytes_per_element


# --8<-- [end:traffic]


# --8<-- [start:activations]
def activation_element_bytes(precision: str) -> int:
    """Bytes of one saved matmul input or output: 4 in fp32, 2 under bf16 or fp16 autocast."""
    return 4 if check_precision(precision) == "fp32" else 2


def activation_bytes_estimate(
    cfg: ModelConfig,
    *,
    micro_batch: int,
    seq_len: int,
    precision: str = "fp32",
    tensor_parallel: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> int:
    """Bytes TinyTransformer's forward saves for backward (dropout 0), counted tensor by tensor.

    Per block, in elements (b = micro-batch, s = sequence, h = hidden, i = FFN width,
    a = heads): the block input and LayerNorm 1 output (2bsh), q, k and v (3bsh, one
    buffer), attention output (bsh) and log-sum-exp (bas), LayerNorm 2 input and output
    (2bsh), FFN up output and GELU output (2bsi), and each LayerNorm's mean and 1/std
    (4bs). Then the head: final LayerNorm in and out, log-softmax over the vocabulary,
    and the int64 token ids, positions and targets.

    Split over t ranks (``tensor_parallel.tp_model``, Week 4): what lives inside
    a split region is divided by t (q, k, v, the attention output, the FFN's 2bsi, the
    vocabulary's softmax); the norms' inputs and outputs are not. With sequence
    parallelism the norms' inputs and statistics are divided by t too, while each
    column-parallel layer keeps the all-gathered, whole-sequence input it multiplied.

    Recomputation (``core.recompute``, Week 5) keeps less: "selective" runs the attention
    core again in the backward pass and drops its log-sum-exp (bas); "full" keeps each
    block's input (bsh) and runs the whole block again.
    """
    b, s, h, i = micro_batch, seq_len, cfg.hidden_size, cfg.intermediate_size
    a, layers = cfg.num_attention_heads, cfg.num_hidden_layers
    t = tensor_parallel
    sp = t if sequence_parallel else 1  # what the tensors between the regions are divided by
    act = activation_element_bytes(precision)  # matmul outputs: 16-bit under autocast
    fp32 = 4  # norm statistics, log-sum-exp and log-softmax stay in fp32
    bsh = b * s * h
    norms = 2 * bsh // sp + 2 * bsh  # the norms' inputs; their outputs, which the linears keep
    block = act * (norms + 4 * bsh // t + 2 * b * s * i // t) + fp32 * (
        4 * b * s // sp + b * a * s // t
    )
    if check_recompute(recompute) == "selective":
        block -= fp32 * b * a * s // t  # the core's log-sum-exp: it is computed again
    elif recompute == "full":
        block = act * bsh // sp  # the block's input, and nothing else
    head = head_activation_bytes(cfg, micro_batch=b, seq_len=s, precision=precision,
                                 tensor_parallel=t, sequence_parallel=sequence_parallel)  # fmt: skip
    ids = 8 * (2 * b * s + s)  # input ids, targets, positions (int64)
    if t == 1:
        return layers * block + head + ids  # the head's bytes hold the scalar loss
    return layers * block + head + ids + 2 * b * s  # + which ids and targets are this rank's (bool)


def head_activation_bytes(
    cfg: ModelConfig, *, micro_batch: int, seq_len: int, precision: str = "fp32",
    tensor_parallel: int = 1, sequence_parallel: bool = False,
) -> int:  # fmt: skip
    """The head's part: final LayerNorm in and out, its statistics, the log-softmax (and,
    on one rank, the scalar loss)."""
    b, s, h, t = micro_batch, seq_len, cfg.hidden_size, tensor_parallel
    sp = t if sequence_parallel else 1
    act, fp32, bsh = activation_element_bytes(precision), 4, b * s * h
    loss = fp32 if t == 1 else 0
    return act * (bsh // sp + bsh) + fp32 * (2 * b * s // sp + b * s * cfg.vocab_size // t) + loss


# --8<-- [end:activations]


# --8<-- [start:peak]
def activation_peak_bytes(
    cfg: ModelConfig, *, micro_batch: int, seq_len: int, precision: str = "fp32",
    tensor_parallel: int = 1, sequence_parallel: bool = False, recompute: str = "none",
) -> int:  # fmt: skip
    """The most bytes saved at once in a step, forward and backward.

    Without recomputation, the forward's end. With it, the backward pass brings back,
    one block at a time, what that block dropped (full: all of it but its input), and
    the attention core's output saved again when it reruns (selective). The head's saved
    bytes are freed by then, so the peak grows only by what exceeds them.
    """
    shape = dict(micro_batch=micro_batch, seq_len=seq_len, precision=precision,
                 tensor_parallel=tensor_parallel, sequence_parallel=sequence_parallel)  # fmt: skip
    stored = activation_bytes_estimate(cfg, recompute=recompute, **shape)
    one = dataclasses.replace(cfg, num_hidden_layers=1)
    again = activation_bytes_estimate(one, **shape) - activation_bytes_estimate(
        one, recompute=recompute, **shape
    )  # what one block dropped
    if recompute == "selective":  # + the core's output, a new tensor when it reruns
        bsh = micro_batch * seq_len * cfg.hidden_size // tensor_parallel
        again += activation_element_bytes(precision) * bsh
    return stored + max(0, again - head_activation_bytes(cfg, **shape))


# --8<-- [end:peak]


# --8<-- [start:report]
@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryReport:
    states: StateBytes
    activations: int

    @property
    def total(self) -> int:
        return self.states.total + self.activations


def estimate(
    cfg: ModelConfig, *, precision: str, world_size: int, stage: int, micro_batch: int,
    seq_len: int | None = None, shard_size: int | None = None,
) -> MemoryReport:  # fmt: skip
    """Model states per rank (ZeRO-sharded) plus one micro-batch's activations."""
    seq_len = seq_len or cfg.max_position_embeddings
    if micro_batch < 1 or not 1 <= seq_len <= cfg.max_position_embeddings:
        raise UsageError(
            f"micro-batch must be >= 1 and sequence length in 1..{cfg.max_position_embeddings}"
            f", got {micro_batch} and {seq_len}"
        )
    states = zero_state_bytes(
        count_parameters(cfg), stage=stage, world_size=world_size, precision=precision,
        shard_size=shard_size,
    )  # fmt: skip
    acts = activation_bytes_estimate(
        cfg, micro_batch=micro_batch, seq_len=seq_len, precision=precision
    )
    return MemoryReport(states=states, activations=acts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(description="Predict bytes per rank: model states + activations.")
    parser.add_argument("--config", default="code/config/config.json")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--stage", type=int, default=0, help="ZeRO stage 0-3")
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=None, help="default: the config's max")
    parser.add_argument("--shard-size", type=int, default=None,
                        help="hybrid sharding (HSDP): shard over groups of this many ranks")  # fmt: skip
    args = parser.parse_args(argv)
    cfg = load_model_config(args.config)
    r = estimate(cfg, precision=args.precision, world_size=args.world_size, stage=args.stage,
                 micro_batch=args.micro_batch, seq_len=args.seq_len,
                 shard_size=args.shard_size)  # fmt: skip
    hybrid = f" (sharded in groups of {args.shard_size})" if args.shard_size else ""
    print(f"{count_parameters(cfg):,} parameters, {args.precision}, ZeRO-{args.stage}, "
          f"{args.world_size} ranks{hybrid}, micro-batch {args.micro_batch}: bytes per rank")  # fmt: skip
    rows = [("weights", r.states.params), ("gradients", r.states.grads),
            ("optimizer states", r.states.optimizer), ("activations", r.activations),
            ("total", r.total)]  # fmt: skip
    for name, n in rows:
        print(f"  {name:<17} {n:>14,} B  {human_bytes(n):>10}")
    if cfg.dropout:
        print(f"  (activations counted without dropout; the config's {cfg.dropout:g} adds masks)")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))

# --8<-- [end:report]
