"""The recorded Lab 2 runs under docs/generated/lab2/ say what the page says they say.

tools/figures_lab2.py writes them from real torchrun runs. These tests check that each
file is internally consistent (the table against its own JSON, the reports against the
flags that produced them and the script's current source) and re-run the cheapest of
the recorded runs — world size 1, in this process — to compare its final loss.
"""

import json
import re
from pathlib import Path
from typing import Any

import pytest

from helpers import ROOT, load_script
from tinyscale.comm.launch import free_port

LAB2 = ROOT / "docs" / "generated" / "lab2"
SCRIPT = ROOT / "code" / "scripts" / "ddp_simulation_train.py"
# Same seed, same code: bit-for-bit on one machine; the tolerance absorbs other CPUs' kernels.
LOSS_TOLERANCE = 0.01


@pytest.fixture(scope="module")
def world_sizes() -> dict[str, Any]:
    return json.loads((LAB2 / "world_sizes.json").read_text())


def table_rows() -> dict[int, list[str]]:
    rows = (LAB2 / "world_sizes.md").read_text().splitlines()[2:]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    return {int(c[0]): c for c in cells}


def test_the_table_has_world_sizes_1_2_4_with_the_same_global_batch(world_sizes) -> None:
    rows = table_rows()
    assert sorted(rows) == [1, 2, 4]
    for n, cells in rows.items():
        run = world_sizes["runs"][str(n)]
        assert run["world_size"] == n and run["global_batch_size"] == 32
        assert int(cells[1]) == run["micro_batch_size"] == 32 // n


def test_the_tables_numbers_are_those_of_its_runs(world_sizes) -> None:
    for n, cells in table_rows().items():
        run = world_sizes["runs"][str(n)]
        per_rank = [float(x.replace(",", "")) for x in cells[2].split(" / ")]
        assert len(per_rank) == n and all(x > 0 for x in per_rank)
        expected = [r["tokens"] / r["seconds"] for r in run["per_rank"]]
        assert per_rank == [round(x) for x in expected]
        assert float(cells[3].replace(",", "")) == round(run["tokens_per_second"]) > 0
        # each rank's final loss is the last step its own log recorded
        finals = [float(x) for x in cells[4].split(" / ")]
        logged = [run["losses"][str(r)][-1] for r in range(n)]
        assert all(x["step"] == run["steps"] == 40 for x in logged)
        assert finals == [round(x["loss"], 4) for x in logged]
        # the mean column is the global loss: the mean of the ranks' losses
        assert float(cells[5]) == round(run["final_loss"], 4)
        assert abs(sum(x["loss"] for x in logged) / n - run["final_loss"]) <= 1e-4
        assert all(x["global_loss"] == round(run["final_loss"], 4) for x in logged)


def test_the_world_size_changes_the_loss_only_a_little(world_sizes) -> None:
    """What the page says of the recorded runs, read from the page, against their data."""
    finals = [run["final_loss"] for run in world_sizes["runs"].values()]
    page = " ".join((ROOT / "docs" / "workshop" / "lab-2.md").read_text().split())
    said = re.search(
        r"differ by less than ([\d.]+) \(([\d.]+) to ([\d.]+) in the runs above\)", page
    )
    assert said, "the sentence about the final losses moved: update this test"
    bound, low, high = (float(x) for x in said.groups())
    assert max(finals) - min(finals) < bound
    assert (low, high) == (round(min(finals), 4), round(max(finals), 4))
    assert len(set(finals)) == 3, "and not identical: every rank draws its own dropout masks"


def test_world_size_1_rerun_matches_the_recorded_loss(
    world_sizes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cheapest recorded run, again: one process, in this process (about 5 s)."""
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    for key, value in {**env, "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    argv = [*world_sizes["args"], "--output-dir", str(tmp_path), "--log-dir", str(tmp_path)]
    assert load_script("ddp_simulation_train").main(argv) == 0
    fresh = json.loads((tmp_path / "summary.json").read_text())
    recorded = world_sizes["runs"]["1"]
    assert fresh["steps"] == recorded["steps"]
    assert abs(fresh["final_loss"] - recorded["final_loss"]) <= LOSS_TOLERANCE
    assert abs(fresh["heldout_loss"] - recorded["heldout_loss"]) <= LOSS_TOLERANCE


def traceback_lines(report: str) -> list[str]:
    """The source lines of code/scripts/ddp_simulation_train.py that a report quotes."""
    lines = report.splitlines()
    return [
        lines[i + 1].strip()
        for i, line in enumerate(lines)
        if 'File "code/scripts/ddp_simulation_train.py"' in line
    ]


def test_failure_report_names_rank_2_and_its_traceback() -> None:
    report = (LAB2 / "failure.txt").read_text()
    assert report.startswith("torch.distributed.elastic.multiprocessing.errors.ChildFailedError")
    failures, root = report.split("Root Cause (first observed failure):")
    assert re.search(r"rank\s+: 2 \(local_rank: 2\)\n\s+exitcode\s+: 1 ", root)
    assert "error_file: /tmp/torchelastic_<id>/" in root, "@record wrote the error file"
    last = [line.strip() for line in root.splitlines() if line.strip()][-2]  # before ====
    assert last == "RuntimeError: injected failure on rank 2 at step 3"
    others = re.findall(r"rank\s+: (\d) \(local_rank: \d\)\n\s+exitcode\s+: (-?\d+) ", failures)
    assert sorted(r for r, _ in others) == ["0", "1", "3"], "every other rank is accounted for"
    assert all(int(code) != 0 for _, code in others), "and none of them finished"
    assert "(SIGTERM)" in failures, "torchrun tore them down"
    assert "/work/" not in report and "/home/" not in report, "paths are relative"


def test_reports_quote_the_scripts_current_source() -> None:
    """Line numbers drift when the script changes; the quoted source must still be in it."""
    source = SCRIPT.read_text()
    for name in ("failure.txt", "hang.txt"):
        quoted = traceback_lines((LAB2 / name).read_text())
        assert quoted and all(line in source for line in quoted), name


def test_hang_report_is_a_timeout_with_the_two_ranks_in_different_collectives() -> None:
    report = (LAB2 / "hang.txt").read_text()
    assert "Timed out waiting 5000ms" in report
    assert sorted(re.findall(r"rank\s+: (\d) \(local_rank", report)) == ["0", "1"]
    quoted = traceback_lines(report)
    assert "dist.all_reduce(global_loss)  # SUM, only for the log: the mean over ranks" in quoted
    assert any(line.startswith("sync = rank_spread(") for line in quoted)


def test_mismatch_names_both_collectives() -> None:
    lines = (LAB2 / "mismatch.txt").read_text().splitlines()
    assert len(lines) == 2
    assert "Rank 0 is running collective" in lines[0] and "OpType=ALLREDUCE" in lines[0]
    assert "but Rank 1 is running collective" in lines[0] and "OpType=ALLGATHER" in lines[0]
    assert lines[1].startswith("[rank1]: RuntimeError: Detected mismatch between collectives")


def test_elastic_run_resumed_from_step_10_and_ended_where_the_world_2_run_ended(
    world_sizes,
) -> None:
    text = (LAB2 / "elastic.txt").read_text()
    assert "[rank1]: RuntimeError: injected failure on rank 1 at step 13" in text
    assert "failed (exitcode: 1) local_rank: 1" in text
    assert "restart 0 |" in text and "resumed from step 10" in text and "restart 1 |" in text
    final = float(re.search(r"summary: 40 steps \| final loss (\d\.\d+)", text)[1])
    # the uninterrupted world-2 run of the table went through the same 40 steps
    assert final == round(world_sizes["runs"]["2"]["final_loss"], 4)
    rank1 = (LAB2 / "elastic_rank1.log").read_text()
    steps = re.findall(r"step +(\d+)/", rank1)
    assert steps == ["10", "20", "30", "40"], "steps 11-12 were redone, not logged twice"
    assert rank1.index("restart 0") < rank1.index("resumed from step 10") < rank1.index("restart 1")
