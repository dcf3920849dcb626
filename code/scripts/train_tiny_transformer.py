# --8<-- [start:args]
"""Lab 1: train TinyTransformer on one device with a hand-written loop.

Launch:  python code/scripts/train_tiny_transformer.py --epochs 2
Resume:  python code/scripts/train_tiny_transformer.py --epochs 2 --resume runs/lab1/checkpoints/step_000100.pt
"""

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

from tinyscale.core.checkpoint import latest_checkpoint, load_checkpoint
from tinyscale.core.cli import add_flags, from_args
from tinyscale.core.config import load_model_config
from tinyscale.core.device import select_device
from tinyscale.core.errors import ArgumentParser, run_cli
from tinyscale.core.model import TinyTransformer
from tinyscale.core.outputs import check_writable
from tinyscale.core.training import TrainConfig, seed_everything, train
from tinyscale.workflows.shard_loader import SHARDS_NOTE, lab_datasets
from tinyscale.workflows.wandb_log import wandb_run, wandb_setup

DEFAULTS = TrainConfig()  # Lab 1's defaults are TrainConfig's own
FLAGS = ("config", "corpus", "epochs", "global_batch_size", "lr", "warmup_steps",
         "min_lr_ratio", "weight_decay", "grad_clip", "seed", "device", "eval_every",
         "checkpoint_every", "max_steps", "resume", "output_dir", "progress", "wandb")  # fmt: skip
# what train() writes in --output-dir, each checked before any work: (name, a file?)
OUTPUTS = (("checkpoints", False), ("tensorboard", False), ("metrics.jsonl", True),
           ("loss_curve.png", True))  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> TrainConfig:
    """Every flag is a field of TrainConfig (tinyscale.core.cli); --help lists them."""
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(p, DEFAULTS, FLAGS, notes={"corpus": SHARDS_NOTE})
    return from_args(DEFAULTS, p.parse_args(argv))  # every value is checked here


# --8<-- [end:args]


# --8<-- [start:main]
def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    # Check every input before writing anything: a bad flag must not leave a half-made run.
    for name, file in OUTPUTS:  # a file where a folder goes, or the other way: one line
        check_writable(cfg.output_dir, "--output-dir", name, file=file)
    model_cfg = load_model_config(cfg.config)
    device = select_device(cfg.device)
    path = (
        latest_checkpoint(Path(cfg.output_dir, "checkpoints"))
        if cfg.resume == "auto"
        else cfg.resume
    )
    resume = load_checkpoint(path, expect=model_cfg) if path else None

    seed_everything(cfg.seed)
    data = lab_datasets(  # the text, or with --corpus shards:DIR, shards made before
        corpus=cfg.corpus,
        vocab_size=model_cfg.vocab_size,
        block_size=model_cfg.max_position_embeddings,
    )
    model = TinyTransformer(model_cfg)
    print(
        f"device {device} | {model.num_parameters():,} parameters | "
        f"{len(data.train):,} training blocks, {len(data.heldout):,} held-out blocks "
        f"of {model_cfg.max_position_embeddings} tokens"
    )
    config = {**dataclasses.asdict(cfg), "model": dataclasses.asdict(model_cfg)}
    with wandb_run(wandb_setup(cfg.wandb, cfg.output_dir), config=config) as run:  # --wandb
        result = train(model, data, cfg, device, resume=resume, mirror=run)
    print(
        f"done: {result.steps} steps in {result.seconds:.1f} s ({result.tokens_per_second:,.0f} tokens/s) | "
        f"held-out loss {result.first_heldout_loss:.3f} -> {result.final_heldout_loss:.3f} | "
        f"last checkpoint {result.final_checkpoint}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
# --8<-- [end:main]
