"""The recorded outputs under docs/generated/ are what the code produces today.

tools/make_figures.py writes them from real runs; these tests re-run the same command
(the session fixture `lab1_run`) and compare, and check that what the pages claim about
the recorded runs is true of them.
"""

import json
import math
import re
from pathlib import Path

import pytest

from tinyscale.core.metrics import read_metrics

GENERATED = Path(__file__).resolve().parents[2] / "docs" / "generated"

# Same seed, same code: on one machine the re-run is bit-for-bit identical. The tolerance
# only absorbs float differences between CPU kernels (AVX2 vs AVX-512) of other machines.
LOSS_TOLERANCE = 0.01


def losses(records: list[dict]) -> list[tuple[int, str, float]]:
    return [(r["step"], r["split"], r["loss"]) for r in records]


def test_lab1_recorded_metrics_match_a_fresh_run(lab1_run: Path) -> None:
    """The fresh run is the first steps of Lab 1's (same schedule); the page's own block
    re-runs the whole command and compares its printed losses to the last one."""
    fresh = losses(read_metrics(lab1_run / "metrics.jsonl"))
    last = fresh[-1][0]
    recorded = [
        r for r in losses(read_metrics(GENERATED / "lab1" / "metrics.jsonl")) if r[0] <= last
    ]
    assert last >= 200 and len(recorded) > 200
    assert [r[:2] for r in recorded] == [f[:2] for f in fresh], "the run has different steps now"
    worst = max(abs(r[2] - f[2]) for r, f in zip(recorded, fresh, strict=True))
    assert worst <= LOSS_TOLERANCE, f"losses drifted by {worst:.4f}: run `make figures`"


def test_lab1_printed_output_agrees_with_its_metrics() -> None:
    text = (GENERATED / "lab1" / "train.txt").read_text()
    heldout = [
        r for r in read_metrics(GENERATED / "lab1" / "metrics.jsonl") if r["split"] == "heldout"
    ]
    printed = [float(x) for x in re.findall(r"held-out loss (\d+\.\d+) \|", text)]
    assert printed == [round(r["loss"], 3) for r in heldout]
    assert "runs/lab1/checkpoints/step_000414.pt" in text  # the path the page then uses
    assert heldout[-1]["loss"] < heldout[0]["loss"] - 1.0, "Lab 1 promises the loss falls well"
    assert math.isclose(heldout[0]["loss"], math.log(1024), abs_tol=0.1)


@pytest.fixture(scope="module")
def layers() -> dict[str, list[dict]]:
    runs = json.loads((GENERATED / "lab1" / "layers_2_vs_4.json").read_text())
    return {n: runs[n]["heldout"] for n in ("2", "4")}


def test_challenge_answer_holds_for_the_recorded_runs(layers: dict[str, list[dict]]) -> None:
    """The page's answer: per step, 4 layers reach a lower held-out loss at every evaluation."""
    two, four = layers["2"], layers["4"]
    assert [r["step"] for r in two] == [r["step"] for r in four]
    assert all(b["loss"] < a["loss"] for a, b in zip(two[1:], four[1:], strict=True))


def test_challenge_two_layer_run_is_the_lab1_run(layers: dict[str, list[dict]]) -> None:
    lab1 = [
        r for r in read_metrics(GENERATED / "lab1" / "metrics.jsonl") if r["split"] == "heldout"
    ]
    assert [round(r["loss"], 6) for r in layers["2"]] == [round(r["loss"], 6) for r in lab1]


def test_challenge_table_matches_its_json(layers: dict[str, list[dict]]) -> None:
    table = (GENERATED / "lab1" / "layers_2_vs_4.md").read_text()
    for n, records in layers.items():
        row = next(line for line in table.splitlines() if line.startswith(f"| {n} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[2]) == round(records[1]["loss"], 3)
        assert float(cells[3]) == round(records[-1]["loss"], 3)


def test_overview_recorded_output_matches_a_fresh_run(tmp_path: Path) -> None:
    from helpers import load_script

    args = ["--epochs", "1", "--max-steps", "20", "--eval-every", "10", "--device", "cpu"]
    assert load_script("train_tiny_transformer").main([*args, "--output-dir", str(tmp_path)]) == 0
    fresh = [r["loss"] for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "heldout"]
    text = (GENERATED / "overview" / "train.txt").read_text()
    printed = [float(x) for x in re.findall(r"held-out loss (\d+\.\d+) \|", text)]
    assert len(printed) == len(fresh) == 3
    assert all(abs(p - f) <= LOSS_TOLERANCE for p, f in zip(printed, fresh, strict=True))
