"""Lab 1, code/scripts/train_tiny_transformer.py, run for real.

- The Lab 1 command (the shared ``lab1_run`` fixture, ``--epochs 2``) learns and writes
  checkpoints, metrics.jsonl, TensorBoard events and the loss-curve PNG.
- An interrupted run resumed from a checkpoint gives the same records as the run that was
  never interrupted.
- Every bad input is refused through the real CLI: exit code 2, one ``error:`` line on
  stderr, and no output directory created.
"""

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from helpers import ROOT, load_script
from tinyscale.core.checkpoint import load_checkpoint, save_checkpoint
from tinyscale.core.config import load_model_config
from tinyscale.core.errors import run_cli
from tinyscale.core.metrics import read_metrics

SCRIPT = ROOT / "code" / "scripts" / "train_tiny_transformer.py"
SHIPPED_CONFIG = ROOT / "code" / "config" / "config.json"
LOSS_TOLERANCE = 1e-6  # absolute, in nats; see test_resume_matches_the_uninterrupted_run


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return load_script("train_tiny_transformer")


def run(script: ModuleType, out: Path, *args: str) -> None:
    assert script.main([*args, "--output-dir", str(out), "--no-progress"]) == 0


def key(record: dict[str, Any]) -> tuple[int, str]:
    return record["step"], record["split"]


# ---------------------------------------------------------------------------- the Lab 1 run


def test_lab1_run_learns(lab1_run: Path) -> None:
    records = read_metrics(lab1_run / "metrics.jsonl")
    heldout = [r for r in records if r["split"] == "heldout"]
    train = [r for r in records if r["split"] == "train"]
    assert heldout[0]["step"] == 0 and len(heldout) >= 3
    assert heldout[-1]["loss"] < heldout[0]["loss"] - 1.0  # nats
    for r in heldout:
        assert r["perplexity"] == pytest.approx(torch.tensor(r["loss"]).exp().item(), rel=1e-5)
    assert [r["step"] for r in train] == list(range(1, len(train) + 1))  # one record per step
    assert heldout[-1]["step"] == train[-1]["step"]  # the final step is evaluated


def test_lab1_run_writes_checkpoints_metrics_tensorboard_and_plot(lab1_run: Path) -> None:
    records = read_metrics(lab1_run / "metrics.jsonl")
    last_step = max(r["step"] for r in records)
    checkpoints = lab1_run / "checkpoints"
    names = sorted(p.name for p in checkpoints.iterdir())
    expected = [f"step_{s:06d}.pt" for s in range(100, last_step + 1, 100)]
    if last_step % 100:
        expected.append(f"step_{last_step:06d}.pt")  # one always saved at the end
    assert names == expected  # and no temporary files
    assert {"step_000100.pt", "step_000200.pt"} <= set(names)
    final = load_checkpoint(checkpoints / names[-1], expect=load_model_config(SHIPPED_CONFIG))
    assert final["step"] == last_step
    assert [key(r) for r in final["history"]] == [key(r) for r in records]

    events = list((lab1_run / "tensorboard").glob("events.out.tfevents.*"))
    assert events
    accumulator = EventAccumulator(str(lab1_run / "tensorboard"))
    accumulator.Reload()
    assert len(accumulator.Scalars("train/loss")) == last_step
    assert [e.step for e in accumulator.Scalars("heldout/loss")] == [
        r["step"] for r in records if r["split"] == "heldout"
    ]
    png = (lab1_run / "loss_curve.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000


# ---------------------------------------------------------------------------- exact resume


STOP = 200  # the resumed run stops here, at one of the uninterrupted run's checkpoints


def until_stop(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of steps 1 to STOP (both runs evaluate at STOP: it is a multiple of 50)."""
    return [r for r in records if r["step"] <= STOP]


@pytest.fixture(scope="module")
def resumed(script: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Interrupt a run at step 120, resume from step 60 (not the last checkpoint) to 120,
    then from that run's step 120 to step 200, all in the same output directory. (Lab 1's
    page resumes a run to its very end and compares every record: not repeated here.)"""
    out = tmp_path_factory.mktemp("interrupted")
    partial = ["--epochs", "2", "--max-steps", "120", "--checkpoint-every", "60"]
    run(script, out, *partial)
    interrupted = read_metrics(out / "metrics.jsonl")
    killed_save = out / "checkpoints" / ".step_000120.pt.tmp-99999"  # as a SIGKILL leaves it
    killed_save.write_bytes(b"half a checkpoint")
    run(script, out, *partial, "--resume", str(out / "checkpoints" / "step_000060.pt"))
    from_60 = read_metrics(out / "metrics.jsonl")
    later = ["--epochs", "2", "--max-steps", str(STOP)]
    run(script, out, *later, "--resume", str(out / "checkpoints" / "step_000120.pt"))
    return {
        "out": out,
        "killed_save_left": killed_save.exists(),
        "interrupted": interrupted,
        "from_60": from_60,
        "final": read_metrics(out / "metrics.jsonl"),
    }


def assert_same_records(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert [key(r) for r in got] == [key(r) for r in want]
    for g, w in zip(got, want, strict=True):
        assert g["loss"] == pytest.approx(w["loss"], rel=0, abs=LOSS_TOLERANCE), key(g)


def test_a_run_starts_by_removing_what_a_killed_save_left(resumed: dict[str, Any]) -> None:
    assert resumed["killed_save_left"] is False
    assert not list((resumed["out"] / "checkpoints").glob(".*"))


def test_resume_from_an_earlier_checkpoint_drops_later_records(resumed: dict[str, Any]) -> None:
    """Resuming from step 60 of a run that reached 120 drops the records after 60 and makes
    them again: the same steps, the same losses (within 1e-6 nats, bitwise on one machine)."""
    assert max(r["step"] for r in resumed["interrupted"]) == 120
    assert_same_records(resumed["from_60"], resumed["interrupted"])


def test_resumed_training_trajectory_is_exact(resumed: dict[str, Any], lab1_run: Path) -> None:
    """Interrupted at 120, resumed from 60 and then from 120: every record the uninterrupted
    Lab 1 run has up to step 200, with the same loss within 1e-6 nats absolute. On one machine the resumed
    run is bitwise identical, so the tolerance is stated, not needed. The only records allowed
    beyond the uninterrupted run's are held-out evaluations at the interruption step."""
    lab1 = until_stop(read_metrics(lab1_run / "metrics.jsonl"))
    lab1_keys = {key(r) for r in lab1}
    final = until_stop(resumed["final"])
    extra = [r for r in final if key(r) not in lab1_keys]
    assert all(key(r) == (120, "heldout") for r in extra), extra
    assert_same_records([r for r in final if key(r) in lab1_keys], lab1)


def test_resume_matches_the_uninterrupted_run(resumed: dict[str, Any], lab1_run: Path) -> None:
    """The full list of (step, split, loss) records of the interrupted-and-resumed run equals
    the uninterrupted Lab 1 run's: same steps, losses equal within 1e-6 nats absolute. On one
    machine the resumed run is bitwise identical, so the tolerance is stated, not needed."""
    assert_same_records(
        until_stop(resumed["final"]), until_stop(read_metrics(lab1_run / "metrics.jsonl"))
    )


def test_resumed_run_final_checkpoint_matches(resumed: dict[str, Any], lab1_run: Path) -> None:
    """The weights where the resumed run stopped equal the uninterrupted run's at that step."""
    name = f"step_{STOP:06d}.pt"
    ours = load_checkpoint(resumed["out"] / "checkpoints" / name)["model"]
    theirs = load_checkpoint(lab1_run / "checkpoints" / name)["model"]
    for tensor_name, tensor in theirs.items():
        torch.testing.assert_close(ours[tensor_name], tensor, rtol=0, atol=LOSS_TOLERANCE)


# ---------------------------------------------------------------------------- bad input


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def config_with(tmp_path: Path, **changes: Any) -> Path:
    raw = json.loads(SHIPPED_CONFIG.read_text()) | changes
    return write(tmp_path / "config.json", json.dumps(raw))


def other_config_checkpoint(tmp_path: Path) -> Path:
    """A real tinyscale checkpoint, but of a model with a different hidden_size."""
    cfg = dataclasses.replace(load_model_config(SHIPPED_CONFIG), hidden_size=32)
    return save_checkpoint(
        {"model_config": dataclasses.asdict(cfg), "step": 1, "epoch": 0, "model": {}},
        tmp_path / "other.pt",
    )


# case -> (the arguments, made in a temp dir; a phrase the error line must contain)
BAD_INPUTS: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "heads-do-not-divide": (
        lambda t: ["--config", str(config_with(t, num_attention_heads=5))],
        "not divisible",
    ),
    "missing-config": (lambda t: ["--config", str(t / "missing.json")], "not found"),
    "malformed-config": (
        lambda t: ["--config", str(write(t / "bad.json", '{"hidden_size": 64,,}'))],
        "not valid JSON",
    ),
    "unknown-key": (
        lambda t: ["--config", str(config_with(t, hidden_sise=64))],
        "did you mean 'hidden_size'?",
    ),
    "epochs-0": (lambda t: ["--epochs", "0"], "--epochs must be a positive number"),
    "lr-negative": (lambda t: ["--lr", "-1"], "--lr must be a positive"),
    "device-gpu": (lambda t: ["--device", "gpu"], "unknown device 'gpu'"),
    "device-cuda": (lambda t: ["--device", "cuda"], "not available"),
    "corrupt-checkpoint": (
        lambda t: ["--resume", str(write(t / "corrupt.pt", "PK\x03\x04 not really"))],
        "corrupt",
    ),
    "other-config-checkpoint": (
        lambda t: ["--resume", str(other_config_checkpoint(t))],
        "hidden_size=32",
    ),
    "missing-checkpoint": (lambda t: ["--resume", str(t / "missing.pt")], "not found"),
    "missing-corpus": (lambda t: ["--corpus", str(t / "missing.txt")], "neither a known name"),
    "batch-too-big": (lambda t: ["--global-batch-size", "1000000"], "lower --global-batch-size"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_and_writes_nothing(
    case: str, script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if case == "device-cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    make_args, expected = BAD_INPUTS[case]
    out = tmp_path / "run"
    args = [*make_args(tmp_path), "--output-dir", str(out), "--no-progress"]
    if "--config" not in args:  # the shipped config, wherever pytest runs from
        args = ["--config", str(SHIPPED_CONFIG), *args]
    capsys.readouterr()
    assert run_cli(script.main, args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and err.endswith("\n"), err
    assert expected in err
    assert not out.exists()


def test_an_output_dir_that_is_a_file_is_one_line(
    script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    out.write_text("not a directory")
    capsys.readouterr()
    assert run_cli(script.main, ["--config", str(SHIPPED_CONFIG), "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"error: --output-dir {out} is a file: pass a directory (it is created if missing)\n"
    )
    assert out.read_text() == "not a directory"


@pytest.mark.parametrize(
    ("blocker", "output_dir", "message"),
    [
        ("run/checkpoints", "run", "run/checkpoints is a file, where the run writes a folder"),
        ("run/tensorboard", "run", "run/tensorboard is a file, where the run writes a folder"),
        ("run/metrics.jsonl/", "run", "run/metrics.jsonl is a folder, where the run writes a file"),
        ("run/loss_curve.png/", "run", "loss_curve.png is a folder, where the run writes a file"),
        ("a-file", "a-file/run", "a-file/run cannot be created or written (T/a-file is not a"),
    ],
)
def test_a_blocked_output_is_one_line_before_any_work(
    blocker: str, output_dir: str, message: str, script: ModuleType, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A place the run writes, blocked by a file or a folder (a trailing /): refused before
    training, not after it, with nothing written."""
    block = tmp_path / blocker
    block.parent.mkdir(parents=True, exist_ok=True)
    block.mkdir() if blocker.endswith("/") else block.write_text("")
    before = sorted(tmp_path.rglob("*"))
    argv = ["--config", str(SHIPPED_CONFIG), "--output-dir", str(tmp_path / output_dir)]
    capsys.readouterr()
    assert run_cli(script.main, [*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message.replace("T/", f"{tmp_path}/") in err and err.rstrip().endswith("--output-dir")
    assert sorted(tmp_path.rglob("*")) == before


def test_the_default_config_is_found_from_any_folder(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)  # no code/config/config.json below here
    capsys.readouterr()
    assert run_cli(script.main, ["--resume", "missing.pt", "--no-progress"]) == 2
    # the config loaded (it is read first); the next check is the one that failed
    assert "checkpoint missing.pt not found" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--epochs", "2", "--max-steps", "200"], "--max-steps"),  # where lab1_run stopped
        (["--epochs", "1", "--global-batch-size", "32"], "--epochs"),  # 103 steps in all
    ],
)
def test_resume_past_the_end_asks_for_more_steps(
    script: ModuleType,
    lab1_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    flag: str,
) -> None:
    final = sorted((lab1_run / "checkpoints").iterdir())[-1]
    assert final.name == "step_000200.pt"
    out = tmp_path / "run"
    args = [*args, "--resume", str(final), "--output-dir", str(out), "--no-progress"]
    capsys.readouterr()
    assert run_cli(script.main, args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and f"raise {flag} to" in err
    assert not out.exists()


def test_bad_input_through_a_real_process(tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = config_with(tmp_path, hidden_size=64, num_attention_heads=6)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--config", str(config), "--output-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "hidden_size (64) is not divisible by num_attention_heads (6)" in proc.stderr
    assert proc.stdout == ""
    assert not out.exists()
