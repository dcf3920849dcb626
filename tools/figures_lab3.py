"""Regenerate the recorded runs of the Lab 3 page (docs/generated/lab3/).

Run:  python tools/figures_lab3.py [scaling barrier missing]

Every file comes from a real run on this machine (about two minutes on 2 CPU cores):

- scaling: the Lab 2 script on 1, 2 and 4 simulated nodes (one process each, the same
  global batch of 32), started by code/scripts/fake_multi_node_launcher.py; tokens/s
  from each run's summary.json (scaling.json, .md, .png), and the merged log of the
  2-node run by ``python -m tinyscale.ops.log_merge`` (log_merge.txt).
- barrier: 4 ranks arrive at a real ``dist.barrier()`` 0, 0.5, 1 and 1.5 s late
  (barrier.json, .md, .png); then a rank that never comes, seen by ``dist.barrier()``
  and by ``dist.monitored_barrier`` (barrier_timeout.txt).
- missing: node 0 of 2 started alone, its agent waiting 5 s for node 1 (node_missing.txt).

Ports become <port>, absolute paths relative ones. tests/scripts/test_fake_multi_node_launcher.py
and tests/tinyscale/ops/test_multinode.py check the files against themselves.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "code"))

from tinyscale.comm.launch import run_on_ranks  # noqa: E402
from tinyscale.ops.multinode import NEVER, barrier_report, timed_barrier  # noqa: E402

OUT = ROOT / "docs" / "generated" / "lab3"
RUNS = Path("runs") / "lab3-figures"  # relative to ROOT, so printed paths are too
LAUNCHER = "code/scripts/fake_multi_node_launcher.py"
NODES = (1, 2, 4)
STEPS = 30
DELAYS = [0.0, 0.5, 1.0, 1.5]  # seconds each rank "works" before the barrier
TIMEOUT_S = 3.0


def launch(name: str, *launcher_args: str, script_args: tuple[str, ...] = ()) -> str:
    """The launcher from the repository root; its output (stdout and stderr)."""
    out = RUNS / name
    shutil.rmtree(ROOT / out, ignore_errors=True)
    cmd = [
        sys.executable, LAUNCHER, *launcher_args, "--log-dir", str(out / "nodes"), "--",
        *script_args, "--output-dir", str(out), "--log-dir", str(out / "logs"),
    ]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    done = subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return done.stdout + done.stderr


def stable(text: str) -> str:
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<port>", text)
    return text.replace(str(ROOT) + "/", "")


def scaling() -> None:
    runs = {}
    for n in NODES:
        launch(f"scaling/n{n}", "--nnodes", str(n), script_args=("--max-steps", str(STEPS)))
        runs[n] = json.loads((ROOT / RUNS / f"scaling/n{n}" / "summary.json").read_text())
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "scaling.json").write_text(
        json.dumps({"steps": STEPS, "nproc_per_node": 1, "runs": runs}, indent=2) + "\n"
    )
    rows = [
        "| nodes | world size | micro-batch per rank | tokens/s per rank | tokens/s, job | vs 1 node |",
        "|---:|---:|---:|---|---:|---:|",
    ]
    base = runs[1]["tokens_per_second"]
    for n, run in runs.items():
        per_rank = " / ".join(f"{r['tokens'] / r['seconds']:,.0f}" for r in run["per_rank"])
        rows.append(
            f"| {n} | {run['world_size']} | {run['micro_batch_size']} | {per_rank} | "
            f"{run['tokens_per_second']:,.0f} | {run['tokens_per_second'] / base:.2f}x |"
        )
    (OUT / "scaling.md").write_text("\n".join(rows) + "\n")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = list(runs)
    ax.plot(xs, [runs[n]["tokens_per_second"] for n in xs], "o-", label="measured, whole job")
    ax.plot(xs, [base * n for n in xs], "--", color="grey", label="perfect scaling")
    ax.axhline(base * 2, color="tab:red", lw=0.8, ls=":", label="2 cores: at most 2x")
    ax.set_xticks(xs)
    ax.set_xlabel("simulated nodes (1 process each)")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"Global batch 32, {STEPS} steps, 2 CPU cores, gloo over loopback")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "scaling.png", dpi=120)
    merged = subprocess.run(
        [sys.executable, "-m", "tinyscale.ops.log_merge", str(RUNS / "scaling/n2/logs")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    (OUT / "log_merge.txt").write_text(merged.stdout)


def barrier() -> None:
    results = run_on_ranks(timed_barrier, len(DELAYS), DELAYS, timeout_s=30)
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = min(r["start"] for r in results)
    rows = [
        {
            "rank": r["rank"],
            "delay": d,
            "arrived": r["arrived"] - t0,
            "released": r["released"] - t0,
        }
        for r, d in zip(results, DELAYS, strict=True)
    ]
    (OUT / "barrier.json").write_text(json.dumps(rows, indent=2) + "\n")
    table = [
        "| rank | delay (s) | arrived (s) | released (s) | waited (s) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        table.append(
            f"| {r['rank']} | {r['delay']:.1f} | {r['arrived']:.3f} | {r['released']:.3f} | "
            f"{r['released'] - r['arrived']:.3f} |"
        )
    (OUT / "barrier.md").write_text("\n".join(table) + "\n")
    fig, ax = plt.subplots(figsize=(6, 2.9))
    for r in rows:
        ax.barh(
            r["rank"], r["arrived"], color="tab:blue", label="working" if r["rank"] == 0 else None
        )
        ax.barh(
            r["rank"], r["released"] - r["arrived"], left=r["arrived"], color="tab:orange",
            label="waiting in dist.barrier()" if r["rank"] == 0 else None,
        )  # fmt: skip
    ax.axvline(max(r["released"] for r in rows), color="k", lw=0.8, ls=":")
    ax.set_yticks([r["rank"] for r in rows])
    ax.set_ylabel("rank")
    ax.set_xlabel("seconds since the ranks were lined up")
    ax.invert_yaxis()
    fig.legend(fontsize=8, loc="upper center", ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(OUT / "barrier.png", dpi=120)
    lines = ["# dist.barrier(), rank 1 never comes (process group timeout 3 s):"]
    never = run_on_ranks(timed_barrier, 2, [0.0, NEVER], False, TIMEOUT_S, timeout_s=TIMEOUT_S)
    lines += barrier_report(never)
    lines.append("# dist.monitored_barrier(timeout=3 s), rank 2 of 3 never comes:")
    never = run_on_ranks(timed_barrier, 3, [0.0, 0.0, NEVER], True, TIMEOUT_S, timeout_s=30)
    lines += barrier_report(never)
    (OUT / "barrier_timeout.txt").write_text("\n".join(lines) + "\n")


def missing() -> None:
    text = launch(
        "missing", "--nnodes", "2", "--node-rank", "0", "--rdzv-timeout", "5",
        script_args=("--max-steps", "3"),
    )  # fmt: skip
    log = (ROOT / RUNS / "missing" / "nodes" / "node_0.log").read_text().splitlines()
    last = [line for line in log if line and not line.startswith("frame #")][-6:]
    text += "\n$ tail of runs/lab3-figures/missing/nodes/node_0.log (torchrun's traceback, last lines)\n"
    text += "\n".join(last) + "\n"
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "node_missing.txt").write_text(stable(text))


if __name__ == "__main__":
    chosen = sys.argv[1:] or ["scaling", "barrier", "missing"]
    for name in chosen:
        {"scaling": scaling, "barrier": barrier, "missing": missing}[name]()
