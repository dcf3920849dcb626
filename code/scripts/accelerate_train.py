# --8<-- [start:setup]
"""The Lab 1 loop on N processes with Hugging Face Accelerate: same model, same data, same steps.

Launch:  accelerate launch --multi_gpu --num_processes 2 code/scripts/accelerate_train.py --cpu
GPUs:    accelerate launch --multi_gpu --num_processes 8 --mixed_precision bf16 code/scripts/accelerate_train.py

On a machine without GPUs, `--multi_gpu` only means "start N processes with torchrun" and the
script's `--cpu` makes them CPU processes that talk over gloo. `accelerate launch --cpu
--num_processes 2` would start ONE process (Accelerate's own multi-CPU mode needs mpirun):
the script refuses that launch with a one-line error that names the command above.
"""

import argparse
import itertools
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, gather_object, set_seed
from torch.utils.data import DataLoader
from tqdm import tqdm

from tinyscale.compat.accelerate_log import blocks_digest, param_digest, process_logger
from tinyscale.core.checkpoint import (
    checkpoint_name,
    remove_stale_temps,
    save_checkpoint,
    training_state,
)
from tinyscale.core.cli import add_flags, from_args
from tinyscale.core.config import load_model_config
from tinyscale.core.data import build_datasets
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.core.metrics import MetricsLogger
from tinyscale.core.model import TinyTransformer
from tinyscale.core.outputs import check_writable
from tinyscale.core.precision import ACCELERATE_NAMES
from tinyscale.core.step import train_step
from tinyscale.core.training import TrainConfig, log_heldout, lr_at, make_optimizer, plan_steps

LAUNCH = "accelerate launch --multi_gpu --num_processes 2 code/scripts/accelerate_train.py --cpu"
# Lab 1's flags and defaults; the precision, unless given, is what the launcher was told
DEFAULTS = TrainConfig(output_dir="runs/accelerate", log_dir="logs/accelerate", precision=None)
FLAGS = ("config", "corpus", "epochs", "global_batch_size", "grad_accum_steps", "lr",
         "warmup_steps", "min_lr_ratio", "weight_decay", "grad_clip", "seed", "precision",
         "eval_every", "checkpoint_every", "max_steps", "output_dir", "log_dir", "progress")  # fmt: skip
# --8<-- [end:setup]


# --8<-- [start:args]
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(p, DEFAULTS, FLAGS,
              notes={"precision": "default: what `accelerate launch --mixed_precision` says"})  # fmt: skip
    p.add_argument(
        "--cpu", action="store_true", help="CPU processes over gloo, even if there are GPUs"
    )
    return p.parse_args(argv)


# --8<-- [end:args]


# --8<-- [start:checks]
def check_launch(environ: Mapping[str, str]) -> None:
    """Refuse `accelerate launch --cpu --num_processes N`: it sets MASTER_ADDR for N processes
    but starts one, which would then train alone while the reader believes it has company."""
    mpi = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
    forced_cpu = environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")
    alone = "WORLD_SIZE" not in environ and not any(k in environ for k in mpi)
    if forced_cpu and alone and "MASTER_ADDR" in environ:
        raise UsageError(
            "`accelerate launch --cpu` starts one process, whatever --num_processes says (its "
            f"multi-CPU mode needs mpirun): launch with `{LAUNCH}`"
        )


def check_accelerator(
    accelerator: Accelerator, environ: Mapping[str, str], *, global_batch: int, accum: int
) -> int:
    """What only the Accelerator knows: its processes and its device. Returns the micro-batch."""
    launched = int(environ.get("WORLD_SIZE", "1"))
    if accelerator.num_processes != launched:
        raise UsageError(
            f"the launcher started {launched} processes but Accelerate found no GPU for them "
            f"and runs each alone: add --cpu after the script, `{LAUNCH}`"
        )
    if accelerator.mixed_precision == "fp16" and accelerator.device.type == "cpu":
        raise UsageError(
            "fp16 autocast needs a GPU (on CPU Accelerate would silently train in fp32): "
            "use --precision bf16 or fp32"
        )
    per_step = accelerator.num_processes * accum
    if global_batch % per_step:
        lower, upper = (
            global_batch // per_step * per_step,
            (global_batch // per_step + 1) * per_step,
        )
        raise UsageError(
            f"--global-batch-size {global_batch} is not divisible by {accelerator.num_processes} "
            f"processes x {accum} accumulation steps = {per_step}: use a multiple of {per_step}, "
            f"e.g. {lower or upper} or {upper}"
        )
    return global_batch // per_step


# --8<-- [end:checks]


# --8<-- [start:main_setup]
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # Check every flag before the process group exists and before anything is written.
    cfg = from_args(DEFAULTS, args)
    model_cfg = load_model_config(cfg.config)
    check_launch(os.environ)
    if not 0 <= cfg.seed < 2**32:  # Accelerate's set_seed seeds numpy too: it takes no other
        raise UsageError(f"--seed must be a whole number from 0 to 2**32 - 1, got {cfg.seed}")
    for name, file in (("checkpoints", False), ("tensorboard", False), ("metrics.jsonl", True)):
        check_writable(cfg.output_dir, "--output-dir", name, file=file)  # the main process's
    rank = os.environ.get("RANK", "0")  # the process index, before Accelerate is made
    check_writable(cfg.log_dir, "--log-dir", f"rank_{rank}", "train.log", file=True)
    if args.cpu:  # Accelerate imports DeepSpeed, when installed: tell it too, or it warns
        os.environ.setdefault("DS_ACCELERATOR", "cpu")

    accelerator = Accelerator(
        cpu=args.cpu,  # gloo between CPU processes; without it, one process per GPU over nccl
        # our precision names in Accelerate's words (fp32 is "no"); None: the launcher's
        mixed_precision=ACCELERATE_NAMES.get(cfg.precision),
        gradient_accumulation_steps=cfg.grad_accum_steps,
        # shuffle with a generator seeded (seed + epoch) on every process: Lab 1's order
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=cfg.seed),
    )
    micro = check_accelerator(
        accelerator, os.environ, global_batch=cfg.global_batch_size, accum=cfg.grad_accum_steps
    )
    set_seed(cfg.seed)  # the same initial weights on every process, and the same as Lab 1's
    with accelerator.main_process_first():  # rank 0 trains and caches the tokenizer first
        data = build_datasets(
            corpus=cfg.corpus,
            vocab_size=model_cfg.vocab_size,
            block_size=model_cfg.max_position_embeddings,
        )
    batches_per_epoch = len(data.train) // cfg.global_batch_size
    plan = plan_steps(batches_per_epoch, cfg, samples=len(data.train))  # Lab 1's plan
    model = TinyTransformer(model_cfg)
    optimizer = make_optimizer(model, cfg)
    loader = DataLoader(data.train, batch_size=micro, shuffle=True, drop_last=True)
    # prepare(): model -> device and DDP; optimizer -> steps only when gradients are synced;
    # loader -> this process's shard of every global batch, moved to the device
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    # --8<-- [end:main_setup]

    # --8<-- [start:helpers]
    log = process_logger(accelerator, cfg.log_dir)
    out = Path(cfg.output_dir)
    metrics = MetricsLogger(out) if accelerator.is_main_process else None
    if accelerator.is_main_process:  # the one writer of this run's checkpoints
        remove_stale_temps(out / "checkpoints")
    step = 0
    world = f"{accelerator.num_processes} process" + "es" * (accelerator.num_processes > 1)
    log.info(
        f"Accelerate: {world} ({accelerator.distributed_type.value}, backend "
        f"{accelerator.state.backend}) | device {accelerator.device.type} | "
        f"mixed precision {accelerator.mixed_precision}"
    )
    log.info(
        f"{micro} blocks per micro-batch x {cfg.grad_accum_steps} accumulation step(s) x {world}"
        f" = {cfg.global_batch_size} blocks per optimizer step | {plan.steps_per_epoch} steps"
        " per epoch"
    )
    log.debug(
        f"process {accelerator.process_index} of {accelerator.num_processes} "
        f"(local {accelerator.local_process_index}) on {accelerator.device}",
        main_process_only=False,
    )

    def checkpoint() -> Path:
        path = out / "checkpoints" / f"{checkpoint_name(step)}.pt"
        if accelerator.is_main_process:  # one writer: every process holds the same weights
            metrics.flush()
            state = training_state(
                model=accelerator.unwrap_model(model),  # no "module." prefix
                optimizer=optimizer, cfg=cfg, step=step, epoch=step // plan.steps_per_epoch,
                device=accelerator.device, history=metrics.records,
                num_processes=accelerator.num_processes,
            )  # fmt: skip
            save_checkpoint(state, path)
        accelerator.wait_for_everyone()  # nobody reads it, or exits, before it exists
        return path

    def show_heldout(tokens_per_second: float | None = None) -> None:
        if not accelerator.is_main_process:  # the others wait for it in the next all-reduce
            return
        line = log_heldout(
            accelerator.unwrap_model(model), data, metrics, step=step, plan=plan, cfg=cfg,
            device=accelerator.device, tokens_per_second=tokens_per_second,
        )  # fmt: skip
        log.info(line)

    seen: list[torch.Tensor] = []  # this process's micro-batches of the current step

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        seen.append(x)  # x, y: (micro, T), already on accelerator.device
        _, loss = model(x, y)  # under autocast when mixed precision is on
        return loss

    # --8<-- [end:helpers]

    # --8<-- [start:loop]
    show_heldout()
    tokens_per_step = cfg.global_batch_size * data.train.block_size
    hide_bar = None if cfg.progress is None else not cfg.progress  # None: tqdm decides (tty)
    bar = tqdm(total=plan.stop_at, desc="training", unit="step", leave=False, disable=hide_bar)
    bar.disable = bar.disable or not accelerator.is_local_main_process  # one bar per machine
    start, trained_seconds, final = time.perf_counter(), 0.0, None
    model.train()
    while step < plan.stop_at:
        epoch = step // plan.steps_per_epoch
        loader.set_epoch(epoch)  # a fresh shuffle per epoch, as DistributedSampler.set_epoch
        micro_batches = iter(loader)  # this process's shard, one micro-batch at a time
        # the last partial global batch of the epoch is dropped, as in Lab 1
        for _ in range(min(plan.steps_per_epoch, plan.stop_at - step)):
            t0 = time.perf_counter()
            lr = lr_at(step, cfg, plan.total_steps)
            seen.clear()
            result = train_step(
                loss_fn=loss_of,
                micro_batches=itertools.islice(micro_batches, cfg.grad_accum_steps),
                accumulation_steps=cfg.grad_accum_steps,
                optimizer=optimizer,  # prepared: with fp16, its scaler steps it
                lr=lr,
                sync=lambda last: accelerator.accumulate(model),  # no_sync() but on the last
                backward=accelerator.backward,  # loss / grad_accum_steps, then backward
                max_norm=cfg.grad_clip,
                clip_params=model.parameters(),
                clip_fn=accelerator.clip_grad_norm_,  # unscales fp16 gradients first
            )
            step += 1
            trained_seconds += time.perf_counter() - t0
            digest = blocks_digest(seen)
            log.debug(
                f"step {step} | blocks {digest} | loss {result.loss:.4f}",
                main_process_only=False,  # every process logs its own shard to its file
            )
            mine = torch.tensor(result.loss, device=accelerator.device)
            global_loss = accelerator.reduce(mine, reduction="mean").item()
            if step == 1:  # a collective: every process sends its digest to every other
                shards = ", ".join(f"rank {r} {d}" for r, d in enumerate(gather_object([digest])))
                log.info(f"step 1 trained on different blocks per process: {shards}")
            if accelerator.is_main_process:
                metrics.log(
                    step,
                    "train",
                    loss=global_loss,
                    lr=lr,
                    grad_norm=result.grad_norm,
                    epoch=epoch + 1,
                )
            bar.update()
            bar.set_postfix(loss=f"{global_loss:.3f}")
            if step % cfg.eval_every == 0 or step == plan.total_steps:
                show_heldout(step * tokens_per_step / trained_seconds)
            if step % cfg.checkpoint_every == 0 or step == plan.stop_at:
                final = checkpoint()
    bar.close()
    # --8<-- [end:loop]

    # --8<-- [start:summary]
    digest = param_digest(accelerator.unwrap_model(model))
    log.debug(f"parameters {digest}", main_process_only=False)
    digests = gather_object([digest])
    same = "identical" if len(set(digests)) == 1 else "DIFFERENT"
    log.info(f"parameters: {', '.join(f'rank {r} {d}' for r, d in enumerate(digests))} ({same})")
    if accelerator.is_main_process:
        metrics.close()
        heldout = [r["loss"] for r in metrics.records if r["split"] == "heldout"]
        log.info(
            f"done: {step} steps in {time.perf_counter() - start:.1f} s "
            f"({step * tokens_per_step / trained_seconds:,.0f} tokens/s on {world}) | "
            f"held-out loss {heldout[0]:.3f} -> "
            f"{heldout[-1]:.3f} | last checkpoint {final}"
        )
    # Drop the wrapped model before leaving the group, while Python is fully alive: a DDP
    # object freed during interpreter shutdown can abort the process after a clean run.
    model, optimizer, loader = accelerator.free_memory(model, optimizer, loader)
    accelerator.end_training()  # leaves the process group
    return 0 if same == "identical" else 1


if __name__ == "__main__":
    sys.exit(run_cli(main))
# --8<-- [end:summary]
