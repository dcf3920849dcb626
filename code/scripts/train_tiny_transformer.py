# --8<-- [start:args]
"""Lab 1: train TinyTransformer on one device with a hand-written loop.

Launch:  python code/scripts/train_tiny_transformer.py --epochs 2
Resume:  python code/scripts/train_tiny_transformer.py --epochs 2 --resume runs/lab1/checkpoints/step_000100.pt
"""

import argparse
import sys
from collections.abc import Sequence

from tinyscale.core.checkpoint import load_checkpoint
from tinyscale.core.config import DEFAULT_CONFIG_PATH, load_model_config
from tinyscale.core.data import build_datasets
from tinyscale.core.errors import ArgumentParser, run_cli
from tinyscale.core.model import TinyTransformer
from tinyscale.core.training import DEVICES, TrainConfig, seed_everything, select_device, train


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    defaults = TrainConfig()
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(DEFAULT_CONFIG_PATH), help="model config JSON")
    p.add_argument("--epochs", type=int, default=defaults.epochs)
    p.add_argument("--batch-size", type=int, default=defaults.batch_size)
    p.add_argument("--lr", type=float, default=defaults.lr, help="peak learning rate")
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--device", default="auto", help=f"one of {', '.join(DEVICES)}")
    p.add_argument("--checkpoint-every", type=int, default=defaults.checkpoint_every, help="steps")
    p.add_argument("--eval-every", type=int, default=defaults.eval_every, help="steps")
    p.add_argument("--max-steps", type=int, default=None, help="stop early, as if interrupted")
    p.add_argument("--resume", default=None, help="checkpoint to continue from")
    p.add_argument("--output-dir", default=defaults.output_dir)
    p.add_argument(
        "--corpus", default="stdlib", help="stdlib (offline), tinyshakespeare, or a text file"
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return p.parse_args(argv)


# --8<-- [end:args]


# --8<-- [start:main]
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # Check every input before writing anything: a bad flag must not leave a half-made run.
    model_cfg = load_model_config(args.config)
    cfg = TrainConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        eval_every=args.eval_every,
        max_steps=args.max_steps,
        output_dir=args.output_dir,
        progress=False if args.no_progress else None,
    )
    device = select_device(args.device)
    resume = load_checkpoint(args.resume, expect=model_cfg) if args.resume else None

    seed_everything(cfg.seed)
    data = build_datasets(
        corpus=args.corpus,
        vocab_size=model_cfg.vocab_size,
        block_size=model_cfg.max_position_embeddings,
    )
    model = TinyTransformer(model_cfg)
    print(
        f"device {device} | {model.num_parameters():,} parameters | "
        f"{len(data.train):,} training blocks, {len(data.heldout):,} held-out blocks "
        f"of {model_cfg.max_position_embeddings} tokens"
    )
    result = train(model, data, cfg, device, resume=resume)
    print(
        f"done: {result.steps} steps in {result.seconds:.1f} s ({result.tokens_per_second:,.0f} tokens/s) | "
        f"held-out loss {result.first_heldout_loss:.3f} -> {result.final_heldout_loss:.3f} | "
        f"last checkpoint {result.final_checkpoint}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
# --8<-- [end:main]
