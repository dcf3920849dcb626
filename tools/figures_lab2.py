"""Regenerate the recorded runs of the Lab 2 page (docs/generated/lab2/).

Run:  python tools/figures_lab2.py [world_sizes failure hang mismatch elastic]

Every file comes from a real ``torchrun`` of the course code on this machine (about a
minute and a half on 2 CPU cores): the same global batch on 1, 2 and 4 processes, a rank
that crashes, a rank that skips a collective, two ranks calling different collectives
under TORCH_DISTRIBUTED_DEBUG=DETAIL, and an elastic restart. Reports keep torchrun's
words; only what changes from run to run without meaning anything is made stable:
absolute paths become relative to the repository, random temporary names and ports
become <id> and <port>. tests/docs/test_generated_lab2.py checks them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "generated" / "lab2"
RUNS = Path("runs") / "lab2-figures"  # relative to ROOT, so printed paths are too
SCRIPT = "code/scripts/ddp_simulation_train.py"

WORLD_SIZES = (1, 2, 4)
WORLD_ARGS = ["--max-steps", "40", "--log-every", "1"]  # global batch 32, the default
STEP_LINE = re.compile(
    r"rank (?P<rank>\d+)/\d+ .*\| step +(?P<step>\d+)/\d+ \| loss (?P<loss>[\d.]+) "
    r"\| global loss (?P<global_loss>[\d.]+)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(
    nproc: int, name: str, *args: str, script: str = SCRIPT, restarts: int = 0, **env: str
) -> subprocess.CompletedProcess:
    """torchrun from the repository root, output under runs/lab2-figures/<name>/."""
    out = RUNS / name
    shutil.rmtree(ROOT / out, ignore_errors=True)
    port = free_port()
    rdzv = [f"--master-port={port}"]
    if restarts:  # elastic restarts need the c10d rendezvous: a new round per attempt
        rdzv = ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}"]
    paths = ["--output-dir", str(out), "--log-dir", str(out / "logs")] if script == SCRIPT else []
    cmd = [
        "torchrun", f"--nproc_per_node={nproc}", *rdzv, f"--max-restarts={restarts}",
        script, *args, *paths,
    ]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    return subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "OMP_NUM_THREADS": "1",
            **env,
        },
    )


def stable(text: str) -> str:
    """Absolute paths -> relative; random temporary names and ports -> <id>, <port>."""
    text = text.replace(f"{ROOT}/", "")
    text = re.sub(r"/tmp/torchelastic_\w+/\w+?_\w+/", "/tmp/torchelastic_<id>/<run>_<id>/", text)
    return re.sub(r"\[127\.0\.0\.1\]:\d+", "[127.0.0.1]:<port>", text)


def report(stderr: str) -> str:
    """torchrun's closing report: from the ChildFailedError line to the end."""
    start = stderr.index("torch.distributed.elastic.multiprocessing.errors.ChildFailedError")
    return stable(stderr[start:]).rstrip() + "\n"


def write(name: str, text: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / name).write_text(text)
    print(f"wrote {(OUT / name).relative_to(ROOT)}")


def step_losses(log: Path) -> list[dict[str, float]]:
    return [
        {k: float(v) for k, v in m.groupdict().items()}
        for line in log.read_text().splitlines()
        if (m := STEP_LINE.search(line))
    ]


def world_sizes() -> None:
    """The same 40 steps of global batch 32 on 1, 2 and 4 processes: table, JSON and plot."""
    runs = {}
    for n in WORLD_SIZES:
        done = torchrun(n, f"world{n}", *WORLD_ARGS)
        done.check_returncode()
        out = ROOT / RUNS / f"world{n}"
        summary = json.loads((out / "summary.json").read_text())
        summary["losses"] = {
            r: step_losses(out / "logs" / f"rank_{r}" / "train.log") for r in range(n)
        }
        runs[str(n)] = summary
    write("world_sizes.json", json.dumps({"args": WORLD_ARGS, "runs": runs}, indent=1) + "\n")
    rows = [
        "| world size | micro-batch per rank | tokens/s per rank | tokens/s, all ranks "
        "| final loss per rank | mean (global loss) |",
        "|---:|---:|---|---:|---|---:|",
    ]
    for n, s in runs.items():
        per_rank = " / ".join(f"{r['tokens'] / r['seconds']:,.0f}" for r in s["per_rank"])
        finals = " / ".join(f"{s['losses'][r][-1]['loss']:.4f}" for r in range(int(n)))
        rows.append(
            f"| {n} | {s['micro_batch_size']} | {per_rank} | {s['tokens_per_second']:,.0f} "
            f"| {finals} | {s['final_loss']:.4f} |"
        )
    write("world_sizes.md", "\n".join(rows) + "\n")

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    for i, (n, s) in enumerate(runs.items()):
        rates = [r["tokens"] / r["seconds"] for r in s["per_rank"]]
        xs = [i + (r - (len(rates) - 1) / 2) * 0.2 for r in range(len(rates))]
        ax1.bar(xs, rates, width=0.18, color="C0", label="one rank" if i == 0 else None)
        ax1.plot([i - 0.45, i + 0.45], [s["tokens_per_second"]] * 2, color="C3", lw=2,
                 label="all ranks together" if i == 0 else None)  # fmt: skip
        for r, losses in s["losses"].items():
            ax2.plot([x["step"] for x in losses], [x["loss"] for x in losses], lw=0.8,
                     color=f"C{i}", alpha=0.7, label=f"world {n}, rank {r}")  # fmt: skip
    ax1.set_xticks(range(len(runs)), [f"world {n}" for n in runs])
    ax1.set(ylabel="tokens/s (2 CPU cores)", title="Throughput: 2 cores are 2 cores")
    ax1.legend(fontsize=8)
    ax2.set(xlabel="step (global batch 32)", ylabel="this rank's loss")
    ax2.set_title("Loss of every rank: different shards, same model")
    ax2.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(OUT / "world_sizes.png")
    plt.close(fig)
    print(f"wrote {(OUT / 'world_sizes.png').relative_to(ROOT)}")


def failure() -> None:
    """Rank 2 of 4 raises at step 3: torchrun's report."""
    done = torchrun(4, "failure", "--max-steps", "20", "--fail-rank", "2", "--fail-step", "3")
    assert done.returncode == 1, done.returncode
    write("failure.txt", report(done.stderr))


def hang() -> None:
    """Rank 1 skips the loss all-reduce at step 3; the 5 s process-group timeout ends it."""
    args = ["--max-steps", "20", "--log-every", "1", "--hang-rank", "1", "--hang-step", "3"]
    done = torchrun(2, "hang", *args, "--timeout-s", "5")
    assert done.returncode == 1, done.returncode
    write("hang.txt", report(done.stderr))


def mismatch() -> None:
    """Rank 0 all-reduces, rank 1 all-gathers, under TORCH_DISTRIBUTED_DEBUG=DETAIL."""
    done = torchrun(
        2, "mismatch", script="code/scripts/debug_mismatch.py", TORCH_DISTRIBUTED_DEBUG="DETAIL"
    )
    assert done.returncode == 1, done.returncode
    lines = [
        line for line in stable(done.stderr).splitlines() if "Detected mismatch" in line
    ]  # one RuntimeError per rank; the rest is the same traceback twice and the report
    write("mismatch.txt", "\n".join(sorted(lines)) + "\n")


def elastic() -> None:
    """--max-restarts 1, rank 1 fails once at step 13, the group restarts from step 10."""
    args = ["--max-steps", "40", "--log-every", "10", "--checkpoint-every", "10"]
    done = torchrun(
        2, "elastic", *args, "--resume", "auto", "--fail-rank", "1", "--fail-step", "13",
        restarts=1,
    )  # fmt: skip
    done.check_returncode()
    agent = [
        line
        for line in stable(done.stderr).splitlines()
        if line.startswith("[rank1]: RuntimeError: injected failure")
        or "closing signal SIGTERM" in line
        or "failed (exitcode" in line
    ]
    text = "$ stdout (rank 0's log)\n" + stable(done.stdout)
    text += "$ stderr (torchrun's agent and the failing rank, selected lines)\n" + "\n".join(agent)
    write("elastic.txt", text + "\n")
    log = (ROOT / RUNS / "elastic" / "logs" / "rank_1" / "train.log").read_text()
    write("elastic_rank1.log", re.sub(r"^\S+ \S+ ", "", log, flags=re.MULTILINE))


FIGURES = {
    "world_sizes": world_sizes,
    "failure": failure,
    "hang": hang,
    "mismatch": mismatch,
    "elastic": elastic,
}

if __name__ == "__main__":
    for name in sys.argv[1:] or FIGURES:
        FIGURES[name]()
