# --8<-- [start:logger]
"""Where a run's numbers go: a JSON-lines file, TensorBoard, and a loss-curve PNG.

Try it:  tensorboard --logdir runs   (after a training run; then open http://localhost:6006)
"""

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

WANDB_MODES = ("offline", "online")  # --wandb: W&B writes files to sync later, or uploads live

# matplotlib and TensorBoard are imported where they are used, not here: together they
# cost every process that imports this module (each rank of a job) about half a second.


class Mirror(Protocol):
    """Where else the values go: anything with ``log(values, step=)``, such as a W&B run."""

    def log(self, data: dict[str, Any], *, step: int) -> Any: ...


class MetricsLogger:
    """Keep every record in memory (it goes into checkpoints) and mirror it to disk.

    On resume, pass the history saved in the checkpoint: the records after the
    checkpoint's step are dropped, so the curve continues exactly where it was saved.
    A ``mirror`` (a W&B run: tinyscale.workflows.wandb_log) gets every value as well.
    """

    def __init__(
        self, output_dir: Path, *, history: list[dict[str, Any]] | None = None,
        resume_step: int = 0, mirror: Mirror | None = None,
    ) -> None:  # fmt: skip
        self.path = output_dir / "metrics.jsonl"
        self.mirror = mirror
        self.records = [r for r in (history or []) if r["step"] <= resume_step]
        # purge_step: TensorBoard hides older events from this step on: those an interrupted
        # run wrote after its checkpoint, or all of an earlier run in the same directory
        purge_step = resume_step + 1 if resume_step else 0
        from torch.utils.tensorboard import SummaryWriter

        self.tensorboard = SummaryWriter(output_dir / "tensorboard", purge_step=purge_step)

    def log(
        self, step: int, split: str, *, measured: Mapping[str, float] | None = None,
        **values: float,
    ) -> None:  # fmt: skip
        """Record ``values``; ``measured`` ones (tokens/s) go to the mirror only: they time
        this machine, so a resumed run could not reproduce them in the history."""
        self.records.append({"step": step, "split": split, **values})
        for name, value in values.items():
            self.tensorboard.add_scalar(f"{split}/{name}", value, step)
        if self.mirror is not None:
            both = {**values, **(measured or {})}
            self.mirror.log({f"{split}/{name}": value for name, value in both.items()}, step=step)

    def flush(self) -> None:
        """Rewrite metrics.jsonl atomically and flush TensorBoard."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in self.records))
        os.replace(tmp, self.path)
        self.tensorboard.flush()

    def close(self) -> None:
        self.flush()
        self.tensorboard.close()


# --8<-- [end:logger]


# --8<-- [start:plot]
def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]


def plot_loss_curves(
    runs: dict[str, list[dict[str, Any]]], png: str | Path, *, title: str = "TinyTransformer loss"
) -> Path:
    """Train loss (thin) and held-out loss (markers) against step, one colour per run."""
    import matplotlib

    matplotlib.use("Agg")  # draw to files; no window, works on servers and in CI
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for i, (label, records) in enumerate(runs.items()):
        colour = f"C{i}"
        train = [(r["step"], r["loss"]) for r in records if r["split"] == "train"]
        heldout = [(r["step"], r["loss"]) for r in records if r["split"] == "heldout"]
        if train:
            ax.plot(*zip(*train, strict=True), color=colour, alpha=0.35, lw=1)
        if heldout:
            ax.plot(*zip(*heldout, strict=True), "o-", color=colour, label=f"{label} held-out")
    ax.set(xlabel="optimizer step", ylabel="cross-entropy loss (nats)", title=title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[1]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return Path(png)


# --8<-- [end:plot]
