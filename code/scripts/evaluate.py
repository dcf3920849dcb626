# --8<-- [start:args]
"""Evaluate any course checkpoint: held-out loss, perplexity, a sample, and a JSON report.

Launch:  python code/scripts/evaluate.py runs/lab1/checkpoints/step_000414.pt
Sharded: torchrun --nproc-per-node 2 code/scripts/evaluate.py runs/pipeline/checkpoints

The checkpoint may be Lab 1's file, a ranked or a DCP directory, or a DeepSpeed folder;
a run's checkpoints folder means its newest. Under torchrun each rank scores its share
of the held-out blocks and the sums are all-reduced; rank 0 writes the report.
"""

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import Any

import torch

from tinyscale.comm.dist import distributed
from tinyscale.core.cli import add_flags, from_args
from tinyscale.core.config import load_model_config
from tinyscale.core.data import LMData, build_datasets
from tinyscale.core.device import select_device
from tinyscale.core.errors import ArgumentParser, run_cli
from tinyscale.core.model import TinyTransformer
from tinyscale.core.outputs import check_writable
from tinyscale.core.training import TrainConfig
from tinyscale.workflows.evaluation import (
    KINDS,
    Checkpoint,
    SampleConfig,
    generate,
    heldout_scores,
    read_checkpoint,
    rebuild_model,
    write_report,
)

DEFAULTS = TrainConfig()  # --global-batch-size: blocks per forward pass, as Lab 1 evaluates
FLAGS = ("config", "corpus", "global_batch_size", "device", "timeout_s")
SAMPLE = SampleConfig()
Inputs = tuple[Checkpoint, TinyTransformer, LMData]  # what every rank reads before it joins


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a step_*.pt file, a step folder, or a checkpoints folder")
    add_flags(p, DEFAULTS, FLAGS, notes={"config": "used when the checkpoint stores none"})
    add_flags(p, SAMPLE, [f.name for f in dataclasses.fields(SampleConfig)])
    p.add_argument("--report", default="runs/eval/report.json", help="where the JSON goes")
    args = p.parse_args(argv)
    args.cfg, args.sample = from_args(DEFAULTS, args), from_args(SAMPLE, args)  # checked here
    return args


# --8<-- [end:args]


# --8<-- [start:evaluate]
def check_inputs(args: argparse.Namespace) -> Inputs:
    """Every rank, before any joins the process group: each bad input is one line here.

    Where the report goes, the checkpoint (found, whole, this model's) and the data: a
    typo fails every rank alike at once, not after the evaluation or inside the group.
    """
    check_writable(args.report, "--report", file=True)
    config = load_model_config(args.cfg.config)
    checkpoint = read_checkpoint(args.checkpoint, config=config)
    model = rebuild_model(checkpoint, config)
    data = build_datasets(corpus=args.cfg.corpus, vocab_size=model.cfg.vocab_size,
                          block_size=model.cfg.max_position_embeddings)  # fmt: skip
    return checkpoint, model, data


def evaluate_checkpoint(
    args: argparse.Namespace, inputs: Inputs, device: torch.device
) -> dict[str, Any]:
    """Every rank: draw the sample (alike on every rank), then score its share."""
    checkpoint, model, data = inputs
    model = model.to(device)
    prompt_ids = data.tokenizer.encode(args.sample.prompt).ids
    new = generate(model, prompt_ids, args.sample, device=device)  # an empty --prompt: one line
    scores = heldout_scores(model, data.heldout, batch_size=args.cfg.global_batch_size,
                            device=device)  # fmt: skip
    return {
        "checkpoint": str(checkpoint.path),
        "kind": checkpoint.kind,
        "step": checkpoint.step,
        "model_config_from": "checkpoint" if checkpoint.model_config else args.cfg.config,
        "parameters": model.num_parameters(),
        **scores,
        "sample": {**dataclasses.asdict(args.sample), "text": data.tokenizer.decode(new)},
    }


def show(report: dict[str, Any]) -> None:
    print(f"{report['checkpoint']}: {KINDS[report['kind']]}, step {report['step']}, "
          f"model config from {report['model_config_from']}")  # fmt: skip
    print(f"held-out: {report['blocks']} blocks, {report['tokens']:,} tokens on "
          f"{report['ranks']} rank(s) | loss {report['loss']:.6f} | "
          f"perplexity {report['perplexity']:.2f}")  # fmt: skip
    sample = report["sample"]
    print(f"sample (temperature {sample['temperature']}, top-k {sample['top_k']}, seed "
          f"{sample['seed']}): {sample['prompt'] + sample['text']!r}")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    inputs = check_inputs(args)  # on every rank, before any joins: a bad input fails all alike
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:  # one process: no process group
        report = evaluate_checkpoint(args, inputs, select_device(args.cfg.device))
    else:
        with distributed(args.cfg.device, timeout_s=args.cfg.timeout_s) as (env, device):
            report = evaluate_checkpoint(args, inputs, device)
            if env.rank:
                return 0  # the sums are rank 0's too: it reports
    show(report)
    print(f"report {write_report(report, args.report)}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
# --8<-- [end:evaluate]
