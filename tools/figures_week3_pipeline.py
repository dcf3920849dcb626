"""Regenerate the pipeline timelines of docs/week-3/pipeline-from-scratch.md.

Run:  python tools/figures_week3_pipeline.py   (about 30 s on 2 CPU cores)

For every schedule, p = 4 gloo processes run our pipeline runtime
(tinyscale.pipeline_parallel.pipeline) on an 8-block tiny model with m = 8 micro-batches and
stand-in compute (a sleep in every forward and backward), two steps; the second step's
events are drawn as a Gantt chart beside the simulator's timeline of the same action
lists (tinyscale.pipeline_parallel.schedules.simulate). Writes, under docs/generated/week3/:
pipeline_<schedule>.png (the two timelines) and pipeline_<schedule>.json (the numbers:
simulated and measured bubble per rank, durations, message delay, peaks).
"""

from __future__ import annotations

import functools
import json
import statistics
from fractions import Fraction
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from tinyscale.comm.launch import run_on_ranks
from tinyscale.pipeline_parallel.pipeline import PipelineConfig, compare_with_one_process
from tinyscale.pipeline_parallel.schedules import (
    SCHEDULES,
    bubble,
    bubble_fraction,
    make_schedule,
    message_delay,
    simulate,
    zb_h1_bubble_fraction,
)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "generated" / "week3"
P, M, LAYERS = 4, 8, 8
# Stand-in compute per action, seconds: forward 20 ms, backward 40 ms; a chunk of the
# interleaved schedule is half a stage (half the time); zb-h1 splits the backward in B + W.
SLEEPS = {"naive": (0.02, 0.04, 0), "gpipe": (0.02, 0.04, 0), "1f1b": (0.02, 0.04, 0),
          "interleaved": (0.01, 0.02, 0), "zb-h1": (0.02, 0.02, 0.02)}  # fmt: skip
# The simulator's durations (t_f, t_b, t_w), in ms: the sleeps alone.
NOMINAL = {name: tuple(round(1000 * t) for t in d) for name, d in SLEEPS.items()}  # fmt: skip
# One Gantt chart per schedule, with the numbers it is drawn from beside it.
FILES = {
    "naive": ("pipeline_naive.json", "pipeline_naive.png"),
    "gpipe": ("pipeline_gpipe.json", "pipeline_gpipe.png"),
    "1f1b": ("pipeline_1f1b.json", "pipeline_1f1b.png"),
    "interleaved": ("pipeline_interleaved.json", "pipeline_interleaved.png"),
    "zb-h1": ("pipeline_zb-h1.json", "pipeline_zb-h1.png"),
}
COLORS = {"F": "#4c72b0", "B": "#dd8452", "W": "#55a868"}


def chunks(name: str) -> int:
    return 2 if name == "interleaved" else 1


def measure(name: str) -> dict:
    config = PipelineConfig(schedule=name, microbatches=M, chunks=chunks(name),
                            sleep=SLEEPS[name])  # fmt: skip
    fn = functools.partial(compare_with_one_process, config, layers=LAYERS)
    ranks = run_on_ranks(fn, P, deadline_s=300)
    timeline = [r["events"] for r in ranks]
    v = chunks(name)
    lists = make_schedule(name, p=P, m=M, v=v)
    t_f, t_b, t_w = (Fraction(t) for t in NOMINAL[name])
    sim = simulate(lists, v=v, t_f=t_f, t_b=t_b, t_w=t_w)
    means = {k: statistics.mean([e.end - e.start for r in timeline for e in r if e.action.kind == k])
             for k in "FBW" if any(e.action.kind == k for r in timeline for e in r)}  # fmt: skip
    delay = message_delay(timeline, v=v)
    with_delay = simulate(lists, v=v, t_comm=delay, replay=timeline)
    return {
        "schedule": name, "p": P, "m": M, "v": v, "nominal_ms": NOMINAL[name],
        "sleep_s": SLEEPS[name],
        "simulated_bubble": [str(b) for b in bubble(sim)],
        "measured_bubble": bubble(timeline),
        "simulated_with_delay": bubble(with_delay),
        "mean_action_s": means, "message_delay_s": delay,
        "peak_measured": [r["peak"] for r in ranks],
        "max_param_diff": max(r["weights"] for r in ranks),
        "simulated": [[[str(t.action), float(t.start), float(t.end)] for t in r] for r in sim],
        "measured": [[[str(t.action), t.start, t.end] for t in r] for r in timeline],
    }  # fmt: skip


def gantt(ax, rows: list[list[list]], title: str, unit: float) -> None:
    for rank, row in enumerate(rows):
        for label, start, end in row:
            kind = label[0]
            ax.barh(rank, (end - start) / unit, left=start / unit, color=COLORS[kind],
                    edgecolor="white", linewidth=0.5)  # fmt: skip
            ax.text((start + end) / 2 / unit, rank, label[1:], ha="center", va="center",
                    fontsize=5, color="white")  # fmt: skip
    ax.set_yticks(range(len(rows)), [f"rank {r}" for r in range(len(rows))])
    ax.invert_yaxis()
    ax.set_title(title, fontsize=9)


def plot(data: dict, path: Path) -> None:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 4), sharex=True)
    name, b = data["schedule"], data["simulated_bubble"][0]
    gantt(top, data["simulated"], f"{name}: simulator (bubble {b} = {float(Fraction(b)):.3f})",
          unit=1)  # fmt: skip
    measured = " ".join(f"{x:.3f}" for x in data["measured_bubble"])
    gantt(bottom, data["measured"], f"real run, p = {data['p']} gloo processes (bubble {measured})",
          unit=1e-3)  # fmt: skip
    bottom.set_xlabel("ms (simulator: nominal durations; real run: the second step)")
    names = {"F": "forward", "B": "backward", "W": "weight grad"}
    handles = [Patch(color=color, label=names[kind]) for kind, color in COLORS.items()]
    fig.legend(handles=handles, fontsize=7, loc="upper left", ncol=3)
    fig.tight_layout(rect=(0, 0, 1, 0.95))  # room for the legend above
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(runs: list[dict]) -> str:
    """The page's table: per schedule, the formula, the simulator and the real run."""
    rows = [
        "| schedule | p | m | v | formula | simulated | measured (per rank) | "
        "simulated with the measured delay | peak micro-batches (per rank) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for d in runs:
        p, m, v = d["p"], d["m"], d["v"]
        t_f, t_b, t_w = d["nominal_ms"]
        formula = {
            "naive": Fraction(p - 1, p),
            "zb-h1": zb_h1_bubble_fraction(p, m, t_f=t_f, t_b=t_b, t_w=t_w),
        }.get(d["schedule"], bubble_fraction(p, m, v))
        sim = Fraction(d["simulated_bubble"][0])
        rows.append(
            f"| {d['schedule']} | {p} | {m} | {v} | {formula} | {sim} = {float(sim):.3f} | "
            + " ".join(f"{b:.3f}" for b in d["measured_bubble"])
            + " | "
            + " ".join(f"{b:.3f}" for b in d["simulated_with_delay"])
            + " | "
            + " ".join(str(k) for k in d["peak_measured"])
            + " |"
        )
    return "\n".join(rows) + "\n"


def write_table() -> None:
    runs = [json.loads((OUT / FILES[name][0]).read_text()) for name in SCHEDULES]
    (OUT / "pipeline_table.md").write_text(table(runs))


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name in SCHEDULES:
        data = measure(name)
        numbers, png = FILES[name]
        (OUT / numbers).write_text(json.dumps(data, indent=1) + "\n")
        plot(data, OUT / png)
        print(f"wrote {OUT.relative_to(ROOT)}/{numbers}, {png}")
    write_table()
    print(f"wrote {OUT.relative_to(ROOT)}/pipeline_table.md")


if __name__ == "__main__":
    main()
