# --8<-- [start:check]
"""What every distributed training job checks before it starts, and the one way it starts.

Try it:  python code/scripts/pipeline_train.py    # no torchrun: one line, exit code 2

torchrun starts the same script on every rank, and every rank checks every input before
any of them joins the process group: a bad flag then fails all ranks alike, with one line
that names the fix, instead of leaving one rank waiting for a peer that never comes. Each
script checks its own flags (its batch split, its parallel layout); ``check_job`` checks
what every job has: its place in the world (from the launcher's environment), its device,
the folders it writes, its model, and the checkpoint it resumes from. A script's ``Run``
is a ``Job`` with the script's own checked fields added.
"""

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from tinyscale.comm.dist import DistEnv, device_for, dist_env, distributed
from tinyscale.core.checkpoint import latest_checkpoint
from tinyscale.core.cli import flag
from tinyscale.core.config import ModelConfig, load_model_config
from tinyscale.core.data import LMData
from tinyscale.core.errors import UsageError, run_cli
from tinyscale.core.outputs import check_writable
from tinyscale.core.training import StepPlan, TrainConfig, data_and_plan


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
    """What every distributed script knows, checked, before joining the process group."""

    env: DistEnv  # rank and world size, from the launcher's environment
    device: torch.device  # one GPU per rank (chosen by local rank), or the CPU
    model_cfg: ModelConfig
    cfg: TrainConfig  # every flag checked; cfg.timeout_s bounds every collective
    checkpoint: Path | None  # what --resume picked: a path, the newest complete one, or None


J = TypeVar("J", bound=Job)  # a script's Run: a Job with its own fields


def check_job(
    cfg: TrainConfig, *, env: DistEnv | None = None, dropout: float | None = None,
    newest: Callable[[Path], Path | None] = latest_checkpoint,
) -> Job:  # fmt: skip
    """Every job's checks, each a one-line UsageError; the script's own checks follow.

    ``dropout`` overrides the model config's (a script's --dropout); ``newest`` finds
    what --resume auto resumes from in the output folder's checkpoints/.
    """
    env = dist_env() if env is None else env  # no RANK/WORLD_SIZE or MASTER_ADDR: one line
    device = device_for(env, cfg.device)  # --device cuda without a GPU: one line
    # every place the job writes (core.outputs): rank 0 the checkpoints, every rank its log
    check_writable(cfg.output_dir, flag("output_dir"), "checkpoints")
    check_writable(cfg.log_dir, flag("log_dir"), f"rank_{env.rank}", "train.log", file=True)
    model_cfg = load_model_config(cfg.config)
    if dropout is not None:
        if not 0 <= dropout < 1:
            raise UsageError(f"--dropout must be in [0, 1), got {dropout}")
        model_cfg = dataclasses.replace(model_cfg, dropout=dropout)
    if cfg.resume == "auto":  # the newest complete checkpoint, or None: start from scratch
        checkpoint = newest(Path(cfg.output_dir, "checkpoints"))
    else:
        checkpoint = None if cfg.resume is None else Path(cfg.resume)
    return Job(env=env, device=device, model_cfg=model_cfg, cfg=cfg, checkpoint=checkpoint)


# --8<-- [end:check]


# --8<-- [start:start]
def run_job(main: Callable[[Sequence[str] | None], int]) -> int | None:
    """Run a torchrun script's ``main``: ``run_cli`` under torchrun's ``@record``.

    Bad input is one line on stderr and exit code 2, without a traceback (``run_cli``).
    Any other exception is written, traceback and all, to the file torchrun names in
    TORCHELASTIC_ERROR_FILE, then raised: torchrun's report shows the failing rank's own
    traceback as the root cause. ``--help`` returns None: exit code 0.
    """
    return record(run_cli)(main)


# --8<-- [end:start]


# --8<-- [start:train_job]
def training_main(
    parse: Callable[[Sequence[str] | None], Any], check: Callable[[Any], J],
    train: Callable[[J, LMData, StepPlan], None],
) -> Callable[[Sequence[str] | None], int]:  # fmt: skip
    """A torchrun training script's ``main``: every flag checked (``check(parse(argv))``),
    its data and plan of steps (resuming: the steps left, from ``run.resume["step"]``)
    before any rank joins; then join, train, and always leave the process group."""

    def main(argv: Sequence[str] | None = None) -> int:
        run = check(parse(argv))  # all checks first: a bad flag fails every rank alike
        resume = getattr(run, "resume", None)
        step = None if resume is None else resume["step"]
        data, plan = data_and_plan(run.cfg, run.model_cfg, resume_step=step)
        with distributed(run.cfg.device, timeout_s=run.cfg.timeout_s):  # joins, always leaves
            train(run, data, plan)
        return 0

    return main


# --8<-- [end:train_job]
