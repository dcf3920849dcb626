"""tinyscale.ops.log_merge: every rank's train.log in one timeline, one summary row per rank.

Real logs from a short torchrun of the Lab 2 script (2 ranks, 3 steps), and synthetic
files for the edge cases: a missing rank, an empty file, a line that is not a log line.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT
from tinyscale.comm.launch import free_port
from tinyscale.core.errors import UsageError, run_cli
from tinyscale.ops.log_merge import format_table, format_timeline, main, merge

STEP = "step {s:4d}/103 | loss {loss:.4f} | global loss 6.9 | tokens/s {tps} | samples 16 | max param diff vs rank 0 0.0e+00"


def write_log(log_dir: Path, rank: int, lines: list[tuple[str, str]], world: int = 3) -> Path:
    path = log_dir / f"rank_{rank}" / "train.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(f"2026-01-02 10:00:{t} rank {rank}/{world} local_rank 0 | {m}\n" for t, m in lines)
    )
    return path


def test_timeline_is_in_time_order_ties_by_rank(tmp_path: Path) -> None:
    write_log(
        tmp_path, 0, [("00,100", "start"), ("00,300", STEP.format(s=1, loss=6.5, tps="1,000"))]
    )
    write_log(
        tmp_path, 1, [("00,050", "start"), ("00,300", STEP.format(s=1, loss=6.7, tps="3,000"))]
    )
    write_log(tmp_path, 2, [("00,200", "start")])
    timeline, _ = merge(tmp_path)
    assert [(line.rank, line.message[:6]) for line in timeline] == [
        (1, "start"), (0, "start"), (2, "start"), (0, "step  "), (1, "step  "),
    ]  # fmt: skip
    assert format_timeline(timeline)[0] == "10:00:00.050 [rank 1] start"


def test_summary_counts_steps_last_loss_rates_and_problems(tmp_path: Path) -> None:
    write_log(
        tmp_path,
        0,
        [
            ("00,100", "setup"),
            ("01,000", STEP.format(s=10, loss=6.5, tps="1,000")),
            ("02,000", "WARNING: the data loader is slow"),
            ("03,000", STEP.format(s=20, loss=6.25, tps="3,000")),
            ("04,000", "checkpoint save failed: disk full"),
        ],
        world=1,
    )
    _, (s,) = merge(tmp_path)
    assert (s.rank, s.status, s.lines, s.steps, s.last_step) == (0, "ok", 5, 2, 20)
    assert s.last_loss == 6.25 and s.mean_tokens_per_s == 2000.0 and s.problems == 2
    assert format_table([s])[2] == "| 0 | ok | 5 | 2 | 20 | 6.2500 | 2,000 | 2 |"


def test_a_missing_rank_and_an_empty_file_still_merge(tmp_path: Path) -> None:
    write_log(tmp_path, 0, [("00,100", STEP.format(s=1, loss=6.0, tps="10"))], world=4)
    write_log(tmp_path, 2, [])  # the rank started, then wrote nothing
    write_log(tmp_path, 3, [("00,200", "start")], world=4)  # rank 1: no folder at all
    timeline, summaries = merge(tmp_path)
    assert len(timeline) == 2
    assert [s.status for s in summaries] == ["ok", "missing", "empty", "ok"]
    assert format_table(summaries)[3] == "| 1 | missing | 0 | 0 | - | - | - | 0 |"


def test_a_bad_line_is_an_error_naming_the_file_and_the_line(tmp_path: Path) -> None:
    path = write_log(tmp_path, 1, [("00,100", "start"), ("00,200", "go on")])
    path.write_text(path.read_text() + "Traceback (most recent call last):\n")
    with pytest.raises(UsageError, match=rf"^{path}:3: not a rank_logger line: 'Traceback") as err:
        merge(tmp_path)
    assert "\n" not in str(err.value)


def test_a_line_of_another_rank_is_an_error(tmp_path: Path) -> None:
    write_log(tmp_path, 0, [("00,100", "fine")])
    path = tmp_path / "rank_0" / "train.log"
    path.write_text(path.read_text().replace("rank 0/3", "rank 2/3"))
    with pytest.raises(UsageError, match=rf"{path}:1: says rank 2"):
        merge(tmp_path)


def test_cli_no_logs_is_exit_code_2_and_one_line(tmp_path: Path, capsys) -> None:
    assert run_cli(main, [str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"error: no rank_<N>/train.log under {tmp_path}: pass the --log-dir of the run (default logs/)\n"
    )


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Lab 2 script, 2 ranks, 3 steps, every step logged (about 10 s)."""
    out = tmp_path_factory.mktemp("lab3-logs")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
        f"--master-port={free_port()}", "code/scripts/ddp_simulation_train.py",
        "--max-steps", "3", "--log-every", "1", "--output-dir", str(out), "--log-dir", str(out / "logs"),
    ]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def test_real_logs_merge_into_one_ordered_timeline(real_run: Path) -> None:
    timeline, summaries = merge(real_run / "logs")
    files = [real_run / "logs" / f"rank_{r}" / "train.log" for r in (0, 1)]
    assert len(timeline) == sum(len(f.read_text().splitlines()) for f in files)
    assert [line.time for line in timeline] == sorted(line.time for line in timeline)
    assert {line.rank for line in timeline} == {0, 1}
    summary = json.loads((real_run / "summary.json").read_text())
    for s in summaries:
        assert (s.status, s.steps, s.last_step, s.problems) == ("ok", 3, 3, 0)
        assert s.mean_tokens_per_s is not None and s.mean_tokens_per_s > 0
    # the global loss is the mean of the ranks' losses (each logged to 4 decimals)
    mean_last = sum(s.last_loss for s in summaries) / 2
    assert abs(mean_last - summary["final_loss"]) < 1e-4


def test_cli_prints_the_timeline_then_the_table(real_run: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tinyscale.ops.log_merge", str(real_run / "logs")],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    timeline, table = done.stdout.split("\n\n")
    assert all("[rank " in line for line in timeline.splitlines())
    assert table.splitlines()[0].startswith("| rank | status |")
    assert len(table.splitlines()) == 2 + 2
