"""tinyscale.workflows.wandb_log: offline W&B runs written by the labs and read back.

- Lab 1 with --wandb offline (in-process): one run folder; its history holds every value
  of metrics.jsonl and of the TensorBoard events, plus each step's tokens/s, which stays
  out of both; W&B sampled the system metrics; the run finished with exit code 0.
- Lab 2, two ranks with --wandb-every-rank: a run per rank in one group, each with its
  own loss and speed and the same global loss.
- Only rank 0 logs unless every rank is asked for; a failure inside the run marks it
  failed; no wandb-core process outlives the run; bad input: one line, exit 2, no files.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, load_script, recorded_output
from tinyscale.comm.launch import free_port
from tinyscale.core.errors import run_cli
from tinyscale.core.metrics import read_metrics
from tinyscale.workflows.wandb_log import (
    describe,
    last_values,
    main,
    offline_runs,
    read_run,
    read_runs,
    wandb_run,
    wandb_setup,
)

PAGE = "workflows/logging.md"

TINY = ["--max-steps", "4", "--eval-every", "4"]


def wandb_children() -> list[int]:
    """The wandb-core processes this process started that still run."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, rest = stat.read_text().split(" (", 1)
        except OSError:  # the process ended while we looked
            continue
        name, fields = rest.rsplit(") ", 1)
        if name.startswith("wandb-core") and int(fields.split()[1]) == os.getpid():
            found.append(int(pid))
    return found


def test_lab1_logs_every_value_to_wandb_too(tmp_path: Path) -> None:
    out = tmp_path / "lab1"
    script = load_script("train_tiny_transformer")
    assert (
        script.main([*TINY, "--output-dir", str(out), "--no-progress", "--wandb", "offline"]) == 0
    )
    assert wandb_children() == []  # wandb-core stopped with the run
    (run_dir,) = offline_runs(out)
    run = read_run(run_dir)
    assert (run.name, run.group, run.job_type, run.exit_code) == ("lab1", "", "train", 0)
    assert run.config["max_steps"] == 4 and run.config["model"]["hidden_size"] == 64
    # W&B's rows, one per step, against metrics.jsonl: the same numbers, not one more
    records = read_metrics(out / "metrics.jsonl")
    logged = {
        (row["_step"], key.split("/")[0], key.split("/")[1]): value
        for row in run.history
        for key, value in row.items()
        if not key.startswith("_")
    }
    expected = {(r["step"], r["split"], k): v for r in records for k, v in r.items()}
    expected = {key: v for key, v in expected.items() if key[2] not in ("step", "split")}
    speeds = {key: logged.pop(key) for key in list(logged) if key[2] == "tokens_per_second"}
    assert logged == expected
    assert sorted(step for step, _, _ in speeds) == [1, 2, 3, 4] and min(speeds.values()) > 0
    # TensorBoard holds the same values (as float32) and no tokens/s
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard")).Reload()
    tags = events.Tags()["scalars"]
    assert sorted(tags) == sorted({f"{split}/{name}" for _, split, name in expected})
    for tag in tags:
        split, name = tag.split("/")
        got = [(e.step, e.value) for e in events.Scalars(tag)]
        want = [(s, v) for (s, sp, n), v in sorted(expected.items()) if (sp, n) == (split, name)]
        assert [s for s, _ in got] == [s for s, _ in want]
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)
    # the system metrics W&B sampled on its own: this process's memory among them
    assert run.system and all(s["proc.memory.rssMB"] > 0 for s in run.system)
    assert last_values(run.history)["heldout/loss"] == records[-1]["loss"]
    lines = describe(run).splitlines()
    assert lines[:2] == [
        "run lab1 | group - | job train | exit code 0",
        "  5 history rows, steps 0..4",
    ]
    assert f"  heldout/loss             {records[-1]['loss']:.4g}" in lines
    assert lines[-1] == "  system metrics: cpu, memory_percent, proc.memory.rssMB"


def test_every_rank_writes_its_own_run_in_one_group(tmp_path: Path) -> None:
    """Two ranks started as torchrun starts them (its variables, no agent: a second less)."""
    out = tmp_path / "ddp"
    port = str(free_port())
    args = [*TINY[:2], "--log-every", "1", "--output-dir", str(out), "--log-dir", str(out / "logs")]
    cmd = [sys.executable, "code/scripts/ddp_simulation_train.py", *args,
           "--wandb", "offline", "--wandb-every-rank"]  # fmt: skip
    torchrun_env = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": port}  # fmt: skip
    ranks = [
        subprocess.Popen(
            cmd,
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ | torchrun_env | {"RANK": str(rank), "LOCAL_RANK": str(rank)},
        )
        for rank in (0, 1)
    ]
    try:
        errors = [rank.communicate(timeout=120)[1] for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()  # only if it is still running: a timeout
    assert [rank.returncode for rank in ranks] == [0, 0], errors
    runs = read_runs(out)
    assert [(r.name, r.group, r.config["rank"], r.exit_code) for r in runs] == [
        ("rank-0", "ddp", 0, 0),
        ("rank-1", "ddp", 1, 0),
    ]
    rows = [{row["_step"]: row for row in r.history} for r in runs]
    assert sorted(rows[0]) == sorted(rows[1]) == [1, 2, 3, 4]
    for step in (1, 2, 3, 4):
        zero, one = rows[0][step], rows[1][step]
        assert zero["train/global_loss"] == one["train/global_loss"]  # the job's, all-reduced
        assert zero["train/global_loss"] == pytest.approx(
            (zero["train/loss"] + one["train/loss"]) / 2, abs=1e-6
        )  # the mean of the ranks' own losses
        assert zero["train/loss"] != one["train/loss"]  # each rank's own shard
        assert zero["train/lr"] == one["train/lr"] and zero["train/grad_norm"] > 0
        assert zero["train/tokens/s"] > 0 and one["train/tokens/s"] > 0
        assert zero["train/samples"] == one["train/samples"] == 16  # 32 per step, 2 ranks
    # the log lines the ranks print are unchanged: loss and global loss as W&B got them
    lines = (out / "logs" / "rank_1" / "train.log").read_text().splitlines()
    assert f"loss {rows[1][4]['train/loss']:.4f}" in next(x for x in lines if "step    4/" in x)


def test_only_rank_0_logs_unless_every_rank_does() -> None:
    assert wandb_setup(None, "runs/ddp", rank=0) is None  # no --wandb
    names = [getattr(wandb_setup("offline", "runs/ddp", rank=r), "name", None) for r in range(4)]
    assert names == ["ddp", None, None, None]
    every = [wandb_setup("offline", "runs/ddp", rank=r, every_rank=True) for r in range(4)]
    assert [(s.name, s.group) for s in every] == [(f"rank-{r}", "ddp") for r in range(4)]


def test_a_failure_marks_the_run_failed_and_stops_wandb(tmp_path: Path) -> None:
    setup = wandb_setup("offline", tmp_path / "crash")
    with pytest.raises(RuntimeError, match="injected"), wandb_run(setup, config={}) as run:
        run.log({"train/loss": 1.5}, step=1)
        raise RuntimeError("injected")
    assert wandb_children() == []
    (run_dir,) = offline_runs(tmp_path / "crash")
    record = read_run(run_dir)
    assert record.exit_code == 1 and last_values(record.history) == {"train/loss": 1.5}


def test_without_a_setup_nothing_is_started(tmp_path: Path) -> None:
    with wandb_run(None, config={}) as run:
        assert run is None
    assert wandb_children() == [] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script", ["train_tiny_transformer", "ddp_simulation_train"])
def test_an_unknown_mode_is_one_line_exit_2_and_nothing_written(
    script: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main = load_script(script).main
    out = tmp_path / "run"
    assert run_cli(main, ["--wandb", "offlne", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        err == "error: unknown --wandb mode 'offlne': use offline or online, or leave --wandb out\n"
    )
    assert not out.exists()


def test_every_rank_needs_a_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main = load_script("ddp_simulation_train").main
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        assert run_cli(main, ["--wandb-every-rank", "--output-dir", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --wandb-every-rank needs --wandb offline or --wandb online"
    ]
    assert list(tmp_path.iterdir()) == []


def test_reading_a_folder_without_runs_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(main, [str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"error: no W&B run in {tmp_path}/wandb: train with --wandb offline first\n"
    )


def test_the_page_reads_back_what_the_runs_printed() -> None:
    """The page's claims on its recorded outputs: W&B's last held-out loss is the one Lab 1
    printed at its last step; the two ranks agree on the job's numbers, not on their own."""
    printed = recorded_output(PAGE, "--wandb offline --output-dir runs/logging/lab1")
    last_step = [line for line in printed if line.startswith("step ")][-1]
    loss = float(last_step.split("held-out loss ")[1].split()[0])
    read = recorded_output(PAGE, "python -m tinyscale.workflows.wandb_log runs/logging/lab1")
    assert f"heldout/loss {loss:.4g}" in [" ".join(line.split()) for line in read]
    ddp = recorded_output(PAGE, "python -m tinyscale.workflows.wandb_log runs/logging/ddp")
    starts = [i for i, line in enumerate(ddp) if line.startswith("run rank-")]
    ranks = [dict(line.split(maxsplit=1) for line in ddp[i + 2 : i + 8]) for i in starts]
    assert len(ranks) == 2 and ranks[0].keys() == ranks[1].keys()
    for key in ("train/global_loss", "train/grad_norm", "train/lr", "train/samples"):
        assert ranks[0][key] == ranks[1][key], key
    assert ranks[0]["train/loss"] != ranks[1]["train/loss"]
