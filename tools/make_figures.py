"""Regenerate every figure and recorded output the site shows.

Run:  make figures          (or: python tools/make_figures.py [lab1 layers memory])

Each figure comes from a real run of the course code on this machine; tests under
tests/docs/ re-run the same commands and compare what they measure with what is here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "generated"
RUNS = ROOT / "runs" / "figures"
SCRIPT = ROOT / "code" / "scripts" / "train_tiny_transformer.py"

# The exact command Lab 1 shows (run from the repository root).
LAB1_ARGS = ["--epochs", "2"]


def run_lab1(out_dir: Path, *extra: str) -> str:
    """Run the Lab 1 script as the reader would and return what it printed."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    cmd = [sys.executable, str(SCRIPT), *LAB1_ARGS, "--output-dir", str(out_dir), *extra]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout.replace(str(ROOT) + "/", "")


def lab1() -> None:
    """The Lab 1 run: its printed output, its loss curve and its metrics."""
    dest = OUT / "lab1"
    dest.mkdir(parents=True, exist_ok=True)
    run_dir = RUNS / "lab1"
    stdout = run_lab1(run_dir)
    stdout = stdout.replace(str(run_dir.relative_to(ROOT)), "runs/lab1")
    (dest / "train.txt").write_text(stdout)
    shutil.copy(run_dir / "loss_curve.png", dest / "loss_curve.png")
    shutil.copy(run_dir / "metrics.jsonl", dest / "metrics.jsonl")
    print(f"wrote {dest}/train.txt, loss_curve.png, metrics.jsonl")


# The laptop command of the Overview page.
OVERVIEW_ARGS = ["--epochs", "1", "--max-steps", "20", "--eval-every", "10", "--device", "cpu"]


def overview() -> None:
    """The Overview's laptop run: its printed output."""
    dest = OUT / "overview"
    dest.mkdir(parents=True, exist_ok=True)
    run_dir = RUNS / "overview"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cmd = [sys.executable, str(SCRIPT), *OVERVIEW_ARGS, "--output-dir", str(run_dir)]
    stdout = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    stdout = stdout.replace(str(run_dir), "runs/overview")
    (dest / "train.txt").write_text(stdout)
    print(f"wrote {dest}/train.txt")


def layers() -> None:
    """The Lab 1 challenge: num_hidden_layers 2 -> 4, same everything else."""
    from tinyscale.core.metrics import plot_loss_curves, read_metrics

    dest = OUT / "lab1"
    dest.mkdir(parents=True, exist_ok=True)
    base = json.loads((ROOT / "code" / "config" / "config.json").read_text())
    runs, rows = {}, []
    for n in (2, 4):
        config = RUNS / f"config-{n}-layers.json"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(json.dumps({**base, "num_hidden_layers": n}, indent=2))
        stdout = run_lab1(RUNS / f"layers-{n}", "--config", str(config))
        records = read_metrics(RUNS / f"layers-{n}" / "metrics.jsonl")
        runs[f"{n} layers"] = records
        heldout = [r for r in records if r["split"] == "heldout"]
        summary = stdout.strip().splitlines()[-1]
        tokens_per_s = float(summary.split("(")[1].split(" tokens/s")[0].replace(",", ""))
        seconds = float(summary.split(" steps in ")[1].split(" s")[0])
        params = int(stdout.split(" parameters")[0].split("| ")[-1].replace(",", ""))
        rows.append((n, params, heldout[1]["loss"], heldout[-1]["loss"], tokens_per_s, seconds))
    plot_loss_curves(runs, dest / "layers_2_vs_4.png", title="Lab 1 challenge: 2 vs 4 layers")
    lines = [
        "| layers | parameters | held-out loss, step 50 | held-out loss, end | tokens/s | training time |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {n} | {p:,} | {early:.3f} | {end:.3f} | {tps:,.0f} | {sec:.1f} s |"
        for n, p, early, end, tps, sec in rows
    ]
    (dest / "layers_2_vs_4.md").write_text("\n".join(lines) + "\n")
    (dest / "layers_2_vs_4.json").write_text(
        json.dumps(
            {
                f"{n}": {"heldout": [r for r in runs[f"{n} layers"] if r["split"] == "heldout"]}
                for n in (2, 4)
            },
            indent=1,
        )
    )
    print(f"wrote {dest}/layers_2_vs_4.png, .md, .json")


MODEL_SIZES = {"GPT-2 small\n124M": 124e6, "1.3B": 1.3e9, "7B": 7e9, "13B": 13e9, "70B": 70e9}


def model_states_data() -> dict[str, dict[str, float]]:
    """Bytes of model states (bf16 weights and gradients, fp32 Adam) per model size."""
    from tinyscale.core.memory import model_state_bytes

    states = {label: model_state_bytes(n, "bf16") for label, n in MODEL_SIZES.items()}
    return {
        label: {key: getattr(s, key) for key in ("params", "grads", "optimizer")}
        for label, s in states.items()
    }


def memory() -> None:
    """Session A: bytes of model states for well-known model sizes against GPU memory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dest = OUT / "session_a"
    dest.mkdir(parents=True, exist_ok=True)
    data = model_states_data()
    gib = 2**30
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    x = range(len(data))
    bottom = [0.0] * len(data)
    for label, key in (
        ("weights (2 B)", "params"),
        ("gradients (2 B)", "grads"),
        ("Adam + fp32 master (12 B)", "optimizer"),
    ):
        values = [row[key] / gib for row in data.values()]
        ax.bar(x, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    for gpu, mem in (("one 80 GB GPU", 80e9 / gib), ("one 24 GB GPU", 24e9 / gib)):
        ax.axhline(mem, ls="--", color="k", lw=1)
        ax.text(len(data) - 0.5, mem, gpu, ha="right", va="bottom", fontsize=8)
    ax.set_xticks(list(x), list(data))
    ax.set_yscale("log")
    ax.set(
        ylabel="GiB (log scale)", title="Model states for mixed-precision Adam: 16 bytes/parameter"
    )
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(dest / "model_states_by_size.png")
    plt.close(fig)
    (dest / "model_states_by_size.json").write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {dest}/model_states_by_size.png, .json")


FIGURES = {"lab1": lab1, "overview": overview, "layers": layers, "memory": memory}

if __name__ == "__main__":
    for name in sys.argv[1:] or FIGURES:
        FIGURES[name]()
