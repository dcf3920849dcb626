# --8<-- [start:args]
"""Fine-tune Lab 1's model with LoRA on text it never saw: Python's asyncio sources.

Launch:  python code/scripts/finetune_lora.py --base runs/lab1/checkpoints/step_000414.pt

The base model stays frozen; only the adapters (tinyscale.workflows.lora) train, and only
they are saved: a small file that goes on any copy of the same base model.
"""

import argparse
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from tinyscale.core.checkpoint import load_checkpoint
from tinyscale.core.cli import add_flags, from_args
from tinyscale.core.config import ModelConfig
from tinyscale.core.data import (
    LMData,
    TokenBlocks,
    encode_corpus,
    epoch_batches,
    get_batch,
    load_corpus,
    train_tokenizer,
)
from tinyscale.core.device import select_device
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.core.model import TinyTransformer
from tinyscale.core.outputs import check_writable
from tinyscale.core.step import train_step
from tinyscale.core.training import TrainConfig, evaluate, lr_at, plan_steps, seed_everything
from tinyscale.workflows.evaluation import KINDS, detect_kind
from tinyscale.workflows.lora import (
    TARGETS,
    LoRAConfig,
    adapter_parameters_on_paper,
    add_lora,
    load_adapter,
    optimizer_state_bytes,
    save_adapter,
    set_merged,
    trainable_parameters,
)

DEFAULTS = TrainConfig(corpus="asyncio", epochs=1, lr=3e-2, warmup_steps=5, weight_decay=0.0,
                       output_dir="runs/lora")  # fmt: skip
FLAGS = ("corpus", "epochs", "global_batch_size", "lr", "warmup_steps", "min_lr_ratio",
         "grad_clip", "seed", "device", "max_steps", "output_dir", "progress")  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(p, DEFAULTS, FLAGS, notes={"corpus": "asyncio: the standard library's asyncio"})
    p.add_argument("--base", required=True, help="a Lab 1 checkpoint (runs/lab1/checkpoints/...)")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank r (default: 8)")
    p.add_argument("--alpha", type=float, default=16.0, help="the update is scaled by alpha / r")
    p.add_argument("--targets", default=",".join(TARGETS), help="layer names, comma-separated")
    args = p.parse_args(argv)
    args.cfg = from_args(DEFAULTS, args)  # every TrainConfig flag is checked here
    targets = tuple(t.strip() for t in args.targets.split(",") if t.strip())
    args.lora = LoRAConfig(rank=args.rank, alpha=args.alpha, targets=targets)
    return args


# --8<-- [end:args]


# --8<-- [start:data]
# Not in Lab 1's corpus (tinyscale.core.data.STDLIB_FILES): new code, in a style of its own
ASYNCIO_FILES = ("asyncio/events.py", "asyncio/futures.py", "asyncio/locks.py",
                 "asyncio/queues.py", "asyncio/streams.py", "asyncio/tasks.py")  # fmt: skip


def finetune_data(corpus: str, *, base_corpus: str, model_cfg: ModelConfig) -> LMData:
    """The new text, tokenized by the base model's own tokenizer; its last 10 % held out."""
    if corpus == "asyncio":
        root = Path(sysconfig.get_paths()["stdlib"])
        documents = [(root / name).read_text(encoding="utf-8") for name in ASYNCIO_FILES]
    else:
        documents = load_corpus(corpus)
    # the tokenizer Lab 1 trained (cached): the ids the base model's embeddings know
    tokenizer = train_tokenizer(load_corpus(base_corpus), model_cfg.vocab_size)
    tokens = encode_corpus(tokenizer, documents)
    split, block = int(len(tokens) * 0.9), model_cfg.max_position_embeddings
    heldout = TokenBlocks(tokens[split:], block)
    return LMData(tokenizer=tokenizer, train=TokenBlocks(tokens[:split], block), heldout=heldout)


BASE = "one file that holds the whole model, a step_*.pt that train_tiny_transformer.py writes"


def check_base(path: str) -> dict[str, Any]:
    """--base, loaded: one checkpoint file with the whole model in it, or one line that says
    what ``path`` is instead (the course saves sharded checkpoints as folders)."""
    base = Path(path)
    if base.is_dir():
        saved = sorted(base.glob("step_*.pt"))
        if saved:  # a run's checkpoints folder
            raise UsageError(f"--base {path} is a folder: pass one of its files, e.g. {saved[-1]}")
        try:
            what = f"a folder of {KINDS[detect_kind(base)]}"
        except UsageError:  # no checkpoint the course writes
            what = "a folder"
        raise UsageError(f"--base {path} is {what}: --base takes {BASE}")
    if not base.exists():
        raise UsageError(f"--base {path} not found: pass {BASE}")
    state = load_checkpoint(base, fix=f"--base takes {BASE}")
    if state.get("model") is None:
        raise UsageError(f"--base {path} holds no model weights: pass {BASE}")
    return state


def load_base(state: dict) -> TinyTransformer:
    """A fresh TinyTransformer with the weights of a Lab 1 checkpoint."""
    model = TinyTransformer(ModelConfig(**state["model_config"]))
    model.load_state_dict(state["model"])
    return model


# --8<-- [end:data]


# --8<-- [start:train]
def finetune(model: TinyTransformer, data: LMData, cfg: TrainConfig, device: torch.device) -> int:
    """The Lab 1 loop on the adapters only; returns the optimizer's state bytes."""
    params = [p for p in model.parameters() if p.requires_grad]  # A and B, nothing else
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    plan = plan_steps(len(data.train) // cfg.global_batch_size, cfg, samples=len(data.train))
    hide = None if cfg.progress is None else not cfg.progress  # None: shown in a terminal
    model.train()
    step = 0
    with tqdm(
        total=plan.stop_at, disable=hide, desc="fine-tuning", unit="step", leave=False
    ) as bar:
        while step < plan.stop_at:
            epoch, _ = plan.position(step)
            for indices in epoch_batches(len(data.train), cfg.global_batch_size,
                                         seed=cfg.seed, epoch=epoch)[: plan.stop_at - step]:  # fmt: skip
                result = train_step(  # gradients reach A and B; W needs none
                    loss_fn=lambda inputs, targets: model(inputs, targets)[1],
                    micro_batches=[get_batch(data.train, indices, device)],
                    optimizer=optimizer, lr=lr_at(step, cfg, plan.total_steps),
                    max_norm=cfg.grad_clip, clip_params=params,
                )  # fmt: skip
                step += 1
                bar.update()
                bar.set_postfix(loss=f"{result.loss:.3f}")
    return optimizer_state_bytes(optimizer)


# --8<-- [end:train]


# --8<-- [start:main]
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cfg, lora = args.cfg, args.lora
    # Check everything before any work: where the adapter goes (core.outputs), the base,
    # the targets, the rank, the text.
    check_writable(cfg.output_dir, "--output-dir", "adapter.pt", file=True)
    state = check_base(args.base)
    device = select_device(cfg.device)
    seed_everything(cfg.seed)  # the same --seed, the same A: the run is reproducible
    model = load_base(state)
    add_lora(model, lora)  # freezes the base, wraps the targets; bad input raises here
    base_corpus = (state.get("train_config") or {}).get("corpus", "stdlib")
    data = finetune_data(cfg.corpus, base_corpus=base_corpus, model_cfg=model.cfg)
    model.to(device)

    trainable, on_paper = trainable_parameters(model), adapter_parameters_on_paper(model.cfg, lora)
    print(f"base {args.base}: {model.num_parameters() - trainable:,} parameters, frozen")
    print(f"LoRA r={lora.rank} alpha={lora.alpha:g} on {', '.join(lora.targets)}: "
          f"{trainable:,} trainable ({trainable / model.num_parameters():.1%}), "
          f"on paper {on_paper:,}")  # fmt: skip
    print(f"new text: {cfg.corpus}, {len(data.train):,} training blocks, "
          f"{len(data.heldout):,} held-out blocks")  # fmt: skip
    score = dict(batch_size=cfg.global_batch_size, device=device)
    before = evaluate(model, data.heldout, **score)["loss"]
    adam_bytes = finetune(model, data, cfg, device)
    after = evaluate(model, data.heldout, **score)["loss"]
    print(f"held-out loss on the new text: {before:.3f} -> {after:.3f}")
    print(f"AdamW state: {adam_bytes:,} bytes (2 x 4 bytes x {trainable:,} = {8 * trainable:,})")

    path = save_adapter(model, lora, Path(cfg.output_dir) / "adapter.pt")
    print(f"adapter saved alone: {path} ({path.stat().st_size:,} bytes)")
    # --8<-- [end:main]

    # --8<-- [start:reload]
    x, _ = get_batch(data.heldout, torch.arange(4), device)
    model.eval()
    logits = model(x)[0]
    fresh = load_base(state).to(device)  # a new copy of the base, as another job would load it
    load_adapter(fresh, path)
    fresh.eval()
    reloaded = (fresh(x)[0] - logits).abs().max().item()
    set_merged(fresh, True)  # B A folded into W: plain nn.Linear cost at inference
    merged = (fresh(x)[0] - logits).abs().max().item()
    print(
        f"reloaded onto a fresh base: max |logit difference| {reloaded:.1e}; merged: {merged:.1e}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
# --8<-- [end:reload]
