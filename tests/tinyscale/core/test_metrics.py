"""tinyscale.core.metrics: metrics.jsonl and TensorBoard events written and read back, records
after a resume step dropped (on disk and in TensorBoard), and the loss-curve PNG.
"""

import json
import time
from pathlib import Path
from typing import Any

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tinyscale.core.metrics import MetricsLogger, plot_loss_curves, read_metrics

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    accumulator = EventAccumulator(str(run / "tensorboard"))
    accumulator.Reload()
    return [(e.step, e.value) for e in accumulator.Scalars(tag)]


def log_run(run: Path, steps: range, offset: float = 0.0, **kwargs: Any) -> MetricsLogger:
    if kwargs.get("resume_step"):
        # TensorBoard reads event files in name order, and names carry a timestamp with
        # 1-second resolution: a real resume (a new process, later) always sorts after.
        time.sleep(1.1)
    logger = MetricsLogger(run, **kwargs)
    for step in steps:
        logger.log(step, "train", loss=10.0 - step + offset, lr=0.5)
        if step % 2 == 0:
            logger.log(step, "heldout", loss=11.0 - step + offset)
    logger.close()
    return logger


def test_jsonl_and_tensorboard(tmp_path: Path) -> None:
    logger = log_run(tmp_path, range(1, 5))
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records == logger.records
    assert records[0] == {"step": 1, "split": "train", "loss": 9.0, "lr": 0.5}
    assert [(r["step"], r["split"]) for r in records] == [
        (1, "train"), (2, "train"), (2, "heldout"), (3, "train"), (4, "train"), (4, "heldout"),
    ]  # fmt: skip
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == records
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert scalars(tmp_path, "train/loss") == [(1, 9.0), (2, 8.0), (3, 7.0), (4, 6.0)]
    assert scalars(tmp_path, "heldout/loss") == [(2, 9.0), (4, 7.0)]
    assert [v for _, v in scalars(tmp_path, "train/lr")] == [0.5] * 4


def test_flush_leaves_no_temporary_file(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path)
    logger.log(1, "train", loss=1.0)
    logger.flush()
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "split": "train", "loss": 1.0}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "tensorboard"]
    logger.close()


def test_resume_step_drops_later_records(tmp_path: Path) -> None:
    first = log_run(tmp_path, range(1, 7))
    resumed = MetricsLogger(tmp_path, history=first.records, resume_step=4)
    assert resumed.records == [r for r in first.records if r["step"] <= 4]
    assert max(r["step"] for r in resumed.records) == 4
    for step in (5, 6):
        resumed.log(step, "train", loss=100.0 + step)
    resumed.close()
    on_disk = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in on_disk if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in on_disk if r["step"] > 4] == [105.0, 106.0]
    assert not any(r["split"] == "heldout" and r["step"] == 6 for r in on_disk)


def test_resume_replaces_later_tensorboard_events(tmp_path: Path) -> None:
    first = log_run(tmp_path, range(1, 7))
    log_run(tmp_path, range(5, 7), offset=100.0, history=first.records, resume_step=4)
    steps = [s for s, _ in scalars(tmp_path, "train/loss")]
    assert steps[-2:] == [5, 6] and len(steps) == len(set(steps))  # no duplicates
    assert dict(scalars(tmp_path, "train/loss"))[6] == 104.0  # the resumed run's value


def test_resume_keeps_tensorboard_events_at_the_resume_step(tmp_path: Path) -> None:
    first = log_run(tmp_path, range(1, 7))
    log_run(tmp_path, range(5, 7), offset=100.0, history=first.records, resume_step=4)
    assert [s for s, _ in scalars(tmp_path, "train/loss")] == [1, 2, 3, 4, 5, 6]
    assert [s for s, _ in scalars(tmp_path, "heldout/loss")] == [2, 4, 6]


def test_plot_loss_curves_writes_a_png(tmp_path: Path) -> None:
    run_a = log_run(tmp_path / "a", range(1, 9)).records
    run_b = log_run(tmp_path / "b", range(1, 9), offset=0.5).records
    png = plot_loss_curves({"a": run_a, "b": run_b}, tmp_path / "curve.png", title="two runs")
    assert png == tmp_path / "curve.png"
    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 1000


def test_plot_loss_curves_train_only(tmp_path: Path) -> None:
    records = [{"step": s, "split": "train", "loss": 1.0 / s} for s in range(1, 5)]
    png = plot_loss_curves({"run": records}, tmp_path / "train_only.png")
    assert png.read_bytes().startswith(PNG_SIGNATURE)
