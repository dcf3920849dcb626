"""Record torchtitan's pipeline runs that "Pipeline parallelism with PyTorch and torchtitan"
shows beside the one CI runs (PP 2 with 1F1B, on the page itself).

Run:  python tools/figures_week3_torchtitan_pp.py   (a few minutes on 2 CPU cores; part of
      `make figures`)

Each run is ``torchrun ... code/scripts/torchtitan_train.py --module tinyscale.compat.titan_config
--config tinyscale_pp`` with ``--tee 3``, so every line carries its rank; the script reads
the stage split each rank logs and the losses of the rank that holds the last stage.

Writes docs/generated/week3/:
- titan_pp.json: per run, the command, the modules of every stage, the losses by step;
- titan_pp_schedules.txt: 1F1B, Interleaved1F1B and ZBVZeroBubble on 2 processes, side by side;
- titan_pp_fsdp.txt: PP 2 x FSDP 2 on 4 processes.
tests/docs/test_generated_week3_titan.py reads them and checks them against the config and
the run CI does on the page.
"""

from __future__ import annotations

import ast
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "generated" / "week3"
RUNS = {  # name -> (processes, extra flags)
    "1F1B": (2, []),
    "Interleaved1F1B": (2, ["--parallelism.pipeline-parallel-schedule", "Interleaved1F1B"]),
    "ZBVZeroBubble": (2, ["--parallelism.pipeline-parallel-schedule", "ZBVZeroBubble"]),
    "PP 2 x FSDP 2": (4, []),
}
STAGE = re.compile(
    r"^\[default(\d+)\]:.*PP rank (\d+) is building stage_idx (\d+) with modules (\[.*\])"
)
STEP = re.compile(r"^\[default(\d+)\]:.*step: +(\d+) +loss: +(-?[\d.]+)")
MESH = re.compile(r"Building device mesh with parallelism: (.*)")


def command(nproc: int, extra: list[str], dump: str) -> list[str]:
    return [
        "torchrun", "--standalone", f"--nproc-per-node={nproc}", "--tee", "3",
        "code/scripts/torchtitan_train.py",
        "--module", "tinyscale.compat.titan_config", "--config", "tinyscale_pp",
        *extra, "--dump-folder", dump,
    ]  # fmt: skip


def parse(log: str) -> dict:
    """The stage split (by stage index) and the losses by step, from the ranks that know them."""
    stages: dict[int, dict] = {}
    losses: dict[int, float] = {}
    for line in log.splitlines():
        if m := STAGE.match(line):
            rank, pp_rank, idx, modules = int(m[1]), int(m[2]), int(m[3]), m[4]
            entry = stages.setdefault(
                idx, {"pp_rank": pp_rank, "modules": ast.literal_eval(modules), "ranks": []}
            )
            entry["ranks"].append(rank)
        elif (m := STEP.match(line)) and float(m[3]) >= 0:  # the other ranks print -1
            losses.setdefault(int(m[2]), float(m[3]))
    mesh = MESH.search(log)
    return {
        "mesh": mesh[1] if mesh else None,
        "stages": [stages[i] for i in sorted(stages)],
        "losses": [losses[s] for s in sorted(losses)],
    }


def brief(modules: list[str]) -> str:
    """['tok_embeddings', 'layers.0', 'layers.1'] -> 'tok_embeddings + layers 0-1'."""
    layers = [int(m.split(".")[1]) for m in modules if m.startswith("layers.")]
    parts = [m for m in modules if m == "tok_embeddings"]
    if layers:
        parts.append(
            f"layers {layers[0]}-{layers[-1]}" if len(layers) > 1 else f"layer {layers[0]}"
        )
    parts += [m for m in modules if m in ("norm", "lm_head")]
    return " + ".join(parts)


def main() -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (nproc, extra) in RUNS.items():
            cmd = command(nproc, extra, str(Path(tmp) / str(len(results))))
            done = subprocess.run(
                cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
            )
            if done.returncode:
                sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
                raise SystemExit(f"{name}: torchrun exited with {done.returncode}")
            shown = " ".join(cmd).replace(str(Path(tmp)), "<tmp>")
            results[name] = {"command": shown, "processes": nproc, **parse(done.stdout)}
            print(f"{name}: losses {results[name]['losses']}")
    machine = f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.system()}"
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "titan_pp.json").write_text(
        json.dumps({"machine": machine, "runs": results}, indent=1) + "\n"
    )

    lines = [f"{'schedule':<16} {'stage':>5} {'pp rank':>7}  modules"]
    for name in ("1F1B", "Interleaved1F1B", "ZBVZeroBubble"):
        for i, stage in enumerate(results[name]["stages"]):
            label = name if i == 0 else ""
            lines.append(f"{label:<16} {i:>5} {stage['pp_rank']:>7}  {brief(stage['modules'])}")
    lines.append("")
    lines.append(f"{'loss at step':<16} " + " ".join(f"{s:>7}" for s in range(1, 7)))
    for name in ("1F1B", "Interleaved1F1B", "ZBVZeroBubble"):
        lines.append(f"{name:<16} " + " ".join(f"{v:>7.5f}" for v in results[name]["losses"]))
    (OUT / "titan_pp_schedules.txt").write_text("\n".join(lines) + "\n")

    run = results["PP 2 x FSDP 2"]
    fsdp = [f"mesh: {run['mesh']}"]
    for i, stage in enumerate(run["stages"]):
        fsdp.append(f"stage {i} on ranks {sorted(stage['ranks'])}: {brief(stage['modules'])}")
    fsdp.append("loss by step: " + " ".join(f"{v:.5f}" for v in run["losses"]))
    (OUT / "titan_pp_fsdp.txt").write_text("\n".join(fsdp) + "\n")
    for name in ("titan_pp.json", "titan_pp_schedules.txt", "titan_pp_fsdp.txt"):
        print(f"wrote {(OUT / name).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
