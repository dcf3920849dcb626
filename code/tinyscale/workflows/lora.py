# --8<-- [start:header]
"""LoRA from scratch: a frozen nn.Linear plus a trainable low-rank update (Hu et al. 2021).

Try it:  python -c "from tinyscale.workflows.lora import demo; demo()"

Fine-tuning every weight costs, for each parameter, a gradient and two AdamW states. LoRA
freezes a layer's weight W (d_out x d_in) and learns the update (alpha / r) B A instead,
with A (r x d_in) and B (d_out x r): r (d_in + d_out) numbers instead of d_in d_out. B
starts at zero, so step 0 is exactly the pre-trained model; after training, B A folds into
W (``merge``) and the model runs at its old speed.
"""

import copy
import dataclasses
import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tinyscale.comm.counter import CollectiveCounter
from tinyscale.comm.dist import rank_spread
from tinyscale.core.checkpoint import load_checkpoint, save_checkpoint
from tinyscale.core.config import ModelConfig, preset
from tinyscale.core.errors import UsageError
from tinyscale.core.model import TinyTransformer
from tinyscale.core.parity import flat_parameters
from tinyscale.data_parallel.ddp import random_batch

# --8<-- [end:header]


# --8<-- [start:config]
TARGETS = ("attn.qkv", "attn.proj", "ffn.up", "ffn.down")  # every projection of a Block


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoRAConfig:
    """Which layers get an adapter, of which rank, scaled by alpha / rank."""

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = TARGETS  # a layer matches when its name ends with one

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise UsageError(
                f"LoRA rank must be a whole number >= 1, got {self.rank!r}: use e.g. 8"
            )
        if not (self.alpha > 0 and math.isfinite(self.alpha)):
            raise UsageError(f"LoRA alpha must be a positive number, got {self.alpha}: use e.g. 16")
        if not self.targets:
            raise UsageError(f"no LoRA targets: name layers to adapt, e.g. {','.join(TARGETS)}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


# --8<-- [end:config]


# --8<-- [start:layer]
class LoRALinear(nn.Module):
    """``base(x) + scale * x A^T B^T``: the frozen layer and its low-rank update side by side."""

    def __init__(self, base: nn.Linear, *, rank: int, alpha: float, name: str = "layer") -> None:
        super().__init__()
        check_rank(name, base, rank)
        self.base = base.requires_grad_(False)  # W and its bias stay as pre-trained
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))  # (r, d_in)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))  # (d_out, r): B A = 0
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # nn.Linear's init, as PEFT does
        self.scale = alpha / rank
        self.merged = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)  # (B, T, d_out)
        if self.merged:  # B A is inside base.weight already
            return y
        return y + (x @ self.lora_A.T) @ self.lora_B.T * self.scale  # (B,T,d_in)->(B,T,r)->d_out

    def delta(self) -> torch.Tensor:
        """The update the adapter adds to W: scale * B A, (d_out, d_in)."""
        return self.scale * self.lora_B @ self.lora_A

    @torch.no_grad()
    def merge(self) -> None:
        """W += scale B A: one matmul per layer at inference, as before fine-tuning."""
        if not self.merged:
            self.base.weight += self.delta()
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """W -= scale B A: back to the pre-trained W (up to rounding), to train on or swap."""
        if self.merged:
            self.base.weight -= self.delta()
            self.merged = False


def check_rank(name: str, base: nn.Linear, rank: int) -> None:
    """A rank above min(d_in, d_out) adds numbers without adding directions: refuse it."""
    largest = min(base.in_features, base.out_features)
    if not 1 <= rank <= largest:
        raise UsageError(
            f"LoRA rank {rank} does not fit {name} ({base.in_features} -> {base.out_features}): "
            f"use a rank from 1 to {largest}"
        )


# --8<-- [end:layer]


# --8<-- [start:add_lora]
def matches(name: str, target: str) -> bool:
    """PEFT's rule for a list of target_modules: the name, or its end after a dot."""
    return name == target or name.endswith("." + target)


def add_lora(model: nn.Module, cfg: LoRAConfig) -> dict[str, LoRALinear]:
    """Freeze every parameter of ``model``, then wrap each targeted nn.Linear in a LoRALinear.

    Every input is checked before the model is touched: a bad target or rank leaves it as it was.
    """
    owners: dict[int, list[str]] = {}  # a tied weight is one tensor under two names
    for name, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    chosen = {n: m for n, m in linears.items() if any(matches(n, t) for t in cfg.targets)}
    for target in cfg.targets:
        if not any(matches(n, target) for n in chosen):
            free = [n for n, m in linears.items() if len(owners[id(m.weight)]) == 1]
            names = sorted({".".join(n.split(".")[-2:]).lstrip("0123456789.") for n in free})
            raise UsageError(
                f"LoRA target {target!r} matches no nn.Linear of the model: use some of "
                f"{', '.join(names)}"
            )
    for name, linear in chosen.items():  # merge would write B A into the other one too
        if len(also := owners[id(linear.weight)]) > 1:
            target = next(t for t in cfg.targets if matches(name, t))
            raise UsageError(
                f"LoRA target {target!r} would adapt {name}, whose weight is also "
                f"{next(o for o in also if o != f'{name}.weight')} (tied embeddings): merging "
                "B A into it would change both; leave it out of the targets"
            )
    for name, linear in chosen.items():
        check_rank(name, linear, cfg.rank)
    model.requires_grad_(False)  # the whole base model: embeddings, norms, every weight
    layers = {}
    for name, linear in chosen.items():
        parent, _, child = name.rpartition(".")
        layers[name] = LoRALinear(linear, rank=cfg.rank, alpha=cfg.alpha, name=name)
        setattr(model.get_submodule(parent), child, layers[name])
    return layers


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def set_merged(model: nn.Module, merged: bool) -> None:
    """Merge every adapter of ``model`` into its weight, or take them all out again."""
    for layer in lora_layers(model).values():
        layer.merge() if merged else layer.unmerge()


# --8<-- [end:add_lora]


# --8<-- [start:formula]
def adapter_parameters_on_paper(model_cfg: ModelConfig, cfg: LoRAConfig) -> int:
    """r (d_in + d_out) per adapted matrix, from the model's shape alone (not from the modules).

    A target is matched as ``add_lora`` matches it ("up" adapts every ffn.up); the head is
    one matrix for the whole model, the others one per block.
    """
    h, i, v = model_cfg.hidden_size, model_cfg.intermediate_size, model_cfg.vocab_size
    block = {"attn.qkv": (h, 3 * h), "attn.proj": (h, h), "ffn.up": (h, i), "ffn.down": (i, h)}

    def adapted(shapes: dict[str, tuple[int, int]]) -> int:
        chosen = [s for n, s in shapes.items() if any(matches(n, t) for t in cfg.targets)]
        return sum(cfg.rank * (d_in + d_out) for d_in, d_out in chosen)

    return model_cfg.num_hidden_layers * adapted(block) + adapted({"lm_head": (h, v)})


def trainable_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The bytes AdamW keeps, counted from its tensors: exp_avg and exp_avg_sq per parameter."""
    return sum(
        t.numel() * t.element_size()
        for state in optimizer.state.values()
        for name, t in state.items()
        if name != "step"  # one scalar per parameter tensor
    )


# --8<-- [end:formula]


# --8<-- [start:save]
def save_adapter(model: nn.Module, cfg: LoRAConfig, path: str | Path) -> Path:
    """Write A and B of every layer, nothing else, atomically (a temporary file, then rename)."""
    adapter = {}
    for name, layer in lora_layers(model).items():
        adapter[f"{name}.lora_A"] = layer.lora_A.detach().cpu()
        adapter[f"{name}.lora_B"] = layer.lora_B.detach().cpu()
    state = {"model_config": dataclasses.asdict(model.cfg), "lora": dataclasses.asdict(cfg)}
    return save_checkpoint({**state, "adapter": adapter}, path)


def load_adapter(model: TinyTransformer, path: str | Path) -> LoRAConfig:
    """Put a saved adapter onto a fresh base model (which must have the adapter's shape)."""
    state = load_checkpoint(path, expect=model.cfg)  # refuses another model's adapter
    if "adapter" not in state:
        raise UsageError(
            f"{path} holds no adapter: pass the adapter.pt that finetune_lora.py wrote"
        )
    cfg = LoRAConfig(**{**state["lora"], "targets": tuple(state["lora"]["targets"])})
    layers = add_lora(model, cfg)
    with torch.no_grad():
        for name, layer in layers.items():
            layer.lora_A.copy_(state["adapter"][f"{name}.lora_A"])
            layer.lora_B.copy_(state["adapter"][f"{name}.lora_B"])
    return cfg


# --8<-- [end:save]


# --8<-- [start:peft]
def copy_into_peft(model: nn.Module, cfg: LoRAConfig) -> nn.Module:
    """The same adapters in Hugging Face PEFT: the base model copied, A and B copied in."""
    from peft import LoraConfig, inject_adapter_in_model  # a heavy import: only when asked

    if any(layer.merged for layer in lora_layers(model).values()):
        raise UsageError("the adapters are merged into the weights: unmerge them before copying")
    base = copy.deepcopy(model)
    for name, layer in lora_layers(base).items():  # each LoRALinear back to its nn.Linear
        parent, _, child = name.rpartition(".")
        setattr(base.get_submodule(parent), child, layer.base)
    peft_cfg = LoraConfig(
        r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=0.0, target_modules=list(cfg.targets)
    )
    theirs = inject_adapter_in_model(peft_cfg, base)
    with torch.no_grad():
        for name, layer in lora_layers(model).items():
            peft_layer = theirs.get_submodule(name)
            peft_layer.lora_A["default"].weight.copy_(layer.lora_A)
            peft_layer.lora_B["default"].weight.copy_(layer.lora_B)
    return theirs


# --8<-- [end:peft]


# --8<-- [start:distributed]
def ddp_lora(steps: int = 2, rank: int = 4, seed: int = 0) -> dict[str, Any]:
    """On every rank: LoRA under DDP, the bytes of each gradient bucket counted by a comm hook.

    DDP builds its buckets from the parameters that require a gradient: the frozen base
    is never all-reduced. Returns bytes per step, the adapters' spread over the ranks, and
    the losses, to compare with FSDP2 on the same batches.
    """
    torch.manual_seed(seed)  # the same base and the same A on every rank
    model = TinyTransformer(preset("tiny"))
    add_lora(model, LoRAConfig(rank=rank))
    ddp = nn.parallel.DistributedDataParallel(model)
    sent: list[int] = []

    def count(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()  # the flat gradients of one bucket
        sent.append(buffer.numel() * buffer.element_size())
        buffer.div_(dist.get_world_size())  # DDP averages: sum / N
        return dist.all_reduce(buffer, async_op=True).get_future().then(lambda f: f.value()[0])

    ddp.register_comm_hook(None, count)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses, per_step = [], []
    for step in range(steps):
        before = sum(sent)
        losses.append(train_step(ddp, optimizer, step=step, seed=seed))
        per_step.append(sum(sent) - before)
    adapter = flat_parameters(p for p in model.parameters() if p.requires_grad)
    return {"bytes_per_step": per_step, "trainable": trainable_parameters(model),
            "spread": rank_spread(adapter), "losses": losses}  # fmt: skip


def fsdp_lora(steps: int = 2, rank: int = 4, seed: int = 0) -> dict[str, Any]:
    """On every rank: LoRA under FSDP2 (fully_shard per block, then the root).

    A unit holds frozen and trainable parameters together; FSDP2 shards each parameter on
    its own, gathers all of them for compute and reduce-scatters only the gradients.
    """
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = TinyTransformer(preset("tiny"))
    add_lora(model, LoRAConfig(rank=rank))
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    with CollectiveCounter() as counter:
        losses = []
        for step in range(steps):
            counter.counting = step == steps - 1  # the last step: nothing left to set up
            losses.append(train_step(model, optimizer, step=step, seed=seed))
    ops: dict[str, int] = {}
    for call in counter.calls:
        ops[call.op] = ops.get(call.op, 0) + call.nbytes
    return {"bytes_last_step": ops, "trainable": trainable_parameters(model), "losses": losses}


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, *, step: int, seed: int
) -> float:
    """One AdamW step on this rank's own random batch; the loss."""
    x, y = random_batch(preset("tiny"), batch_size=4, seq_len=16, step=step, seed=seed)
    _, loss = model(x, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def ddp_and_fsdp(steps: int = 2, rank: int = 4, seed: int = 0) -> dict[str, Any]:
    """On every rank: both, in one launch (starting processes costs more than the steps)."""
    return {"ddp": ddp_lora(steps, rank, seed), "fsdp": fsdp_lora(steps, rank, seed)}


# --8<-- [end:distributed]


# --8<-- [start:demo]
def demo() -> None:
    """Wrap the tiny model, show what trains, and that step 0 is the base model exactly."""
    torch.manual_seed(0)
    model = TinyTransformer(preset("tiny"))
    x = torch.randint(model.cfg.vocab_size, (2, 8))
    before = model(x)[0]
    cfg = LoRAConfig(rank=4)
    layers = add_lora(model, cfg)
    print(f"{len(layers)} layers adapted: {', '.join(layers)}")
    print(
        f"trainable {trainable_parameters(model):,} of {model.num_parameters():,} parameters "
        f"(on paper {adapter_parameters_on_paper(model.cfg, cfg):,})"
    )
    print(f"step 0 equals the base model: {torch.equal(model(x)[0], before)}")


# --8<-- [end:demo]
