# --8<-- [start:setup]
"""Weights & Biases with no network and no account: runs written to disk, uploaded later.

Try it:  python code/scripts/train_tiny_transformer.py --max-steps 20 --wandb offline
Read:    python -m tinyscale.workflows.wandb_log runs/lab1

``--wandb offline`` makes each process that logs write one run folder,
<output_dir>/wandb/offline-run-<time>-<id>/, that ``wandb sync`` uploads later from a
machine with the internet. A job of N ranks writes one run (rank 0's) or N runs, one per
rank, in one W&B group.
"""

import contextlib
import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tinyscale.core.errors import ArgumentParser, UsageError, run_cli

PROJECT = "tinyscale"
SYSTEM_EVERY_S = (
    0.5  # seconds between W&B's CPU and memory samples; its default, 15, suits long runs
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WandbSetup:
    """The W&B run one process writes."""

    mode: str  # offline or online (tinyscale.core.metrics.WANDB_MODES)
    dir: Path  # the run folders go in dir/wandb/
    name: str  # the run's name in the W&B project
    group: str | None = None  # the runs of one job, shown together
    job_type: str = "train"


def wandb_setup(
    mode: str | None, output_dir: str | Path, *, rank: int = 0, every_rank: bool = False
) -> WandbSetup | None:
    """The run this rank writes, or None: no --wandb, or not rank 0 when only rank 0 logs.

    Rank 0 alone: one run named after the output folder, with the job's numbers. Every
    rank: a run per rank, rank-<N>, grouped under the output folder's name.
    """
    if mode is None or (rank != 0 and not every_rank):
        return None
    job = Path(output_dir).resolve().name
    if every_rank:
        return WandbSetup(mode=mode, dir=Path(output_dir), name=f"rank-{rank}", group=job)
    return WandbSetup(mode=mode, dir=Path(output_dir), name=job)


# --8<-- [end:setup]


# --8<-- [start:run]
@contextlib.contextmanager
def wandb_run(setup: WandbSetup | None, *, config: Mapping[str, Any]) -> Iterator[Any]:
    """A W&B run for the ``with`` block (None if ``setup`` is None), always finished.

    An exception inside the block marks the run failed (exit code 1) and goes on up.
    W&B keeps a helper process, wandb-core, that writes the run's file and samples the
    system metrics; it is stopped on the way out, whatever happened.
    """
    if setup is None:
        yield None
        return
    import wandb  # here, not at the top: a second of import for runs that never log

    setup.dir.mkdir(parents=True, exist_ok=True)
    settings = wandb.Settings(
        silent=True,  # no banner on stdout: the run's own log lines stay as they were
        console="off",  # stdout stays untouched (W&B would copy it into the run)
        x_stats_sampling_interval=SYSTEM_EVERY_S,
        init_timeout=60,  # seconds: starting wandb-core may not hang the job
    )
    run = None
    try:
        run = wandb.init(
            mode=setup.mode, dir=setup.dir, project=PROJECT, name=setup.name, group=setup.group,
            job_type=setup.job_type, config=dict(config), settings=settings,
        )  # fmt: skip
        yield run
        run.finish(exit_code=0)  # writes the run's last records
    except BaseException:
        if run is not None:
            run.finish(exit_code=1)  # W&B shows the run as failed
        raise
    finally:
        wandb.teardown()  # stops wandb-core now, not when this process exits


# --8<-- [end:run]


# --8<-- [start:read]
@dataclasses.dataclass(frozen=True, kw_only=True)
class RunRecords:
    """What an offline run folder holds, as W&B itself reads it back."""

    name: str
    group: str
    job_type: str
    config: dict[str, Any]
    history: list[dict[str, Any]]  # one row per step: what run.log got
    system: list[dict[str, Any]]  # W&B's samples: cpu (%), memory_percent, proc.memory.rssMB ...
    exit_code: int | None  # 0: finished; None: still running, or killed before finish


def offline_runs(output_dir: str | Path) -> list[Path]:
    """The run folders that ``--wandb offline`` wrote under ``output_dir``, oldest first."""
    return sorted(Path(output_dir, "wandb").glob("offline-run-*"))


def read_run(run_dir: str | Path, *, timeout_s: float = 60.0) -> RunRecords:
    """Read a run folder with W&B's own reader, ``wandb leet inspect --json``.

    It prints the run's .wandb file as JSON, one record a line: the run's name and
    config, a history row per step, a system-metrics sample per interval, the exit code.
    """
    cmd = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=True)
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    run = next(r["run"] for r in records if r["type"] == "run")
    exits = [r["exit"].get("exit_code", 0) for r in records if r["type"] == "exit"]
    return RunRecords(
        name=run.get("display_name", ""),
        group=run.get("run_group", ""),
        job_type=run.get("job_type", ""),
        config={k: v for k, v in run["config"]["update"].items() if k != "_wandb"},
        history=[r["history"]["item"] for r in records if r["type"] == "history"],
        system=[r["stats"]["item"] for r in records if r["type"] == "stats"],
        exit_code=exits[-1] if exits else None,
    )


def read_runs(output_dir: str | Path) -> list[RunRecords]:
    """Every offline run under ``output_dir``, by group and name; read side by side, since
    each read is a process of its own (a second of CPU, most of it starting W&B's CLI)."""
    with ThreadPoolExecutor() as pool:
        runs = list(pool.map(read_run, offline_runs(output_dir)))
    return sorted(runs, key=lambda run: (run.group, run.name))


def last_values(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each key's last value over the rows, W&B's own bookkeeping (_step, _runtime) left out."""
    last: dict[str, Any] = {}
    for row in rows:
        last |= {k: v for k, v in row.items() if not k.startswith("_")}
    return last


# --8<-- [end:read]


# --8<-- [start:main]
# this process's CPU (%), the machine's memory in use (%), this process's memory (MB)
SYSTEM_KEYS = ("cpu", "memory_percent", "proc.memory.rssMB")


def describe(run: RunRecords) -> str:
    """A run in a few lines: who wrote it, how it ended, each key's last value."""
    steps = [row["_step"] for row in run.history]
    lines = [
        f"run {run.name} | group {run.group or '-'} | job {run.job_type} | exit code {run.exit_code}",
        f"  {len(steps)} history rows" + (f", steps {min(steps)}..{max(steps)}" if steps else ""),
    ]
    for key, value in sorted(last_values(run.history).items()):
        shown = f"{value:,.0f} tokens/s" if "tokens" in key else f"{value:.4g}"
        lines.append(f"  {key:24} {shown}")
    sampled = [key for key in SYSTEM_KEYS if any(key in sample for sample in run.system)]
    lines.append(f"  system metrics: {', '.join(sampled) or 'none yet'}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Describe every offline run under each output folder given."""
    p = ArgumentParser(description=main.__doc__)
    p.add_argument("output_dirs", nargs="+", help="the --output-dir of a run")
    for out in p.parse_args(argv).output_dirs:
        if not offline_runs(out):
            raise UsageError(f"no W&B run in {out}/wandb: train with --wandb offline first")
        for run in read_runs(out):
            print(describe(run))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
# --8<-- [end:main]
