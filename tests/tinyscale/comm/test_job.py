"""tinyscale.comm.job: every distributed job's checks before it starts, and run_job.

The checks run in-process with the variables torchrun sets (no process group: they all
run before one exists); each bad input is one line that names the fix. run_job is run_cli
under torchrun's @record: bad input returns 2, --help returns None, and any other error
is written to TORCHELASTIC_ERROR_FILE before it propagates.
"""

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from helpers import one_line_error
from tinyscale.comm.job import Job, check_job, run_job
from tinyscale.core.errors import ArgumentParser, UsageError
from tinyscale.core.training import TrainConfig

RANK_1_OF_4 = {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}


@pytest.fixture
def rank_1_of_4(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in RANK_1_OF_4.items():
        monkeypatch.setenv(key, value)


def config(tmp_path: Path, **changes: object) -> TrainConfig:
    folders = {"output_dir": str(tmp_path / "out"), "log_dir": str(tmp_path / "logs")}
    return TrainConfig(**{"device": "cpu", **folders, **changes})  # type: ignore[arg-type]


def test_the_job_from_the_environment_and_the_flags(rank_1_of_4: None, tmp_path: Path) -> None:
    job = check_job(config(tmp_path), dropout=0.0)
    assert (job.env.rank, job.env.world_size, job.device) == (1, 4, torch.device("cpu"))
    assert job.model_cfg.dropout == 0.0 and job.checkpoint is None
    assert not (tmp_path / "out").exists(), "checking writes nothing"


def test_resume_auto_picks_the_newest_complete_checkpoint(
    rank_1_of_4: None, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "out" / "checkpoints"
    checkpoints.mkdir(parents=True)
    assert check_job(config(tmp_path, resume="auto")).checkpoint is None  # none yet: scratch
    for step in (4, 8):
        torch.save({}, checkpoints / f"step_{step:06d}.pt")  # whole: a zip, as torch.save ends
    (checkpoints / "step_000012").mkdir()  # a directory without its manifest: incomplete
    assert check_job(config(tmp_path, resume="auto")).checkpoint == checkpoints / "step_000008.pt"
    given = check_job(config(tmp_path, resume="elsewhere/step_000002.pt"))
    assert given.checkpoint == Path("elsewhere/step_000002.pt")
    mine = check_job(config(tmp_path, resume="auto"), newest=lambda folder: folder / "latest")
    assert mine.checkpoint == checkpoints / "latest"  # a script's own rule (DeepSpeed's tag)


def test_bad_inputs_are_one_line_naming_the_fix(
    rank_1_of_4: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    message = one_line_error(check_job, config(tmp_path, output_dir=str(blocker / "run")))
    assert message == (
        f"--output-dir {blocker / 'run'} cannot be created or written ({blocker} is not a "
        "folder this process may write to): pass another --output-dir"
    )
    assert one_line_error(check_job, config(tmp_path, log_dir=str(blocker / "logs"))).startswith(
        f"--log-dir {blocker / 'logs'} cannot be created or written"
    )
    assert one_line_error(check_job, config(tmp_path), dropout=1.0) == (
        "--dropout must be in [0, 1), got 1.0"
    )
    assert "config file nowhere.json not found" in one_line_error(
        check_job, config(tmp_path, config="nowhere.json")
    )
    monkeypatch.delenv("RANK")
    assert one_line_error(check_job, config(tmp_path)).startswith("not launched by torchrun")


def test_every_place_the_job_writes_is_checked_before_it_starts(
    rank_1_of_4: None, tmp_path: Path
) -> None:
    """A file where its checkpoints folder goes, a folder where this rank's log goes."""
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    (out / "checkpoints").write_text("")
    assert one_line_error(check_job, config(tmp_path)) == (
        f"--output-dir {out}: {out / 'checkpoints'} is a file, where the run writes a folder: "
        "remove it or pass another --output-dir"
    )
    (out / "checkpoints").unlink()
    (logs / "rank_1" / "train.log").mkdir(parents=True)
    assert one_line_error(check_job, config(tmp_path)) == (
        f"--log-dir {logs}: {logs / 'rank_1' / 'train.log'} is a folder, where the run writes "
        "a file: remove it or pass another --log-dir"
    )
    (logs / "rank_1" / "train.log").rmdir()
    (logs / "rank_0").write_text("")  # another rank's place: that rank checks it
    check_job(config(tmp_path))


def test_a_scripts_run_is_the_job_with_its_own_fields(rank_1_of_4: None, tmp_path: Path) -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Run(Job):
        microbatches: int

    job = check_job(config(tmp_path))
    run = Run(**vars(job), microbatches=4)
    assert (run.env, run.cfg, run.microbatches) == (job.env, job.cfg, 4)


def main(argv: Sequence[str] | None = None) -> int:
    args = ArgumentParser().parse_args(argv)  # --help: SystemExit(0)
    del args
    raise ValueError("a bug, not bad input")


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")  # pytest's captured stderr
def test_run_job_reports_as_torchrun_expects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refused(argv: Sequence[str] | None = None) -> int:
        raise UsageError("--pp 3 does not divide the world")

    assert run_job(refused) == 2
    assert capsys.readouterr().err == "error: --pp 3 does not divide the world\n"
    monkeypatch.setattr("sys.argv", ["script", "--help"])
    assert run_job(main) is None  # exit code 0, as python would give
    capsys.readouterr()
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setattr("sys.argv", ["script"])
    with pytest.raises(ValueError, match="a bug"):
        run_job(main)
    message = json.loads(error_file.read_text())["message"]
    assert "ValueError: a bug, not bad input" in message["message"]
    assert (
        'in main\n    raise ValueError("a bug, not bad input")'
        in message["extraInfo"]["py_callstack"]
    )
