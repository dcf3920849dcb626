# --8<-- [start:header]
"""Merge every rank's log into one timeline, and one line of summary per rank.

Launch:  python -m tinyscale.ops.log_merge logs/            # the timeline, then the table
         python -m tinyscale.ops.log_merge logs/ --summary  # the table only

Each rank of a job writes its own ``<log-dir>/rank_<N>/train.log`` (tinyscale.comm.dist's
rank_logger): on a cluster, on its own node. To see what the *job* did — which rank
was slow, which one stopped logging first, where the first error is — put the lines
side by side in time order, each tagged with its rank. Timestamps come from each
node's clock: on one machine they agree; across nodes only as well as the clocks are
synchronised (NTP: a few milliseconds), so read close calls with care.
"""

import argparse
import dataclasses
import re
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from tinyscale.core.errors import ArgumentParser, UsageError, run_cli

# --8<-- [end:header]


# --8<-- [start:parse]
# rank_logger's format: "%(asctime)s rank R/W local_rank L | message"
LINE = re.compile(
    r"^(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) rank (?P<rank>\d+)/(?P<world>\d+) "
    r"local_rank (?P<local>\d+) \| (?P<message>.*)$"
)
STEP = re.compile(r"^step +(?P<step>\d+)/\d+ \| loss (?P<loss>[\d.]+) \|.*tokens/s (?P<tps>[\d,]+)")
# rank_logger writes no level name: a message that says one of these words is a problem
PROBLEM = re.compile(r"(?i)\b(error|warning|exception|failed|failure)\b")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LogLine:
    time: datetime
    rank: int
    world_size: int
    message: str


def read_rank_log(path: Path, rank: int) -> list[LogLine]:
    """One rank's file, every line checked: a line we cannot read is an error naming it."""
    lines = []
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        match = LINE.match(text)
        if match is None or int(match["rank"]) != rank:
            why = "not a rank_logger line" if match is None else f"says rank {match['rank']}"
            raise UsageError(f"{path}:{number}: {why}: {text[:60]!r}")
        lines.append(
            LogLine(
                time=datetime.strptime(match["time"], "%Y-%m-%d %H:%M:%S,%f"),
                rank=rank,
                world_size=int(match["world"]),
                message=match["message"],
            )
        )
    return lines


def find_logs(log_dir: Path) -> dict[int, Path]:
    """rank -> its train.log, for every rank_<N> folder under log_dir."""
    found = {
        int(path.parent.name.removeprefix("rank_")): path
        for path in log_dir.glob("rank_*/train.log")
        if path.parent.name.removeprefix("rank_").isdigit()
    }
    if not found:
        raise UsageError(
            f"no rank_<N>/train.log under {log_dir}: pass the --log-dir of the run (default logs/)"
        )
    return dict(sorted(found.items()))


# --8<-- [end:parse]


# --8<-- [start:merge]
@dataclasses.dataclass(frozen=True, kw_only=True)
class RankSummary:
    rank: int
    status: str  # "ok", "empty" (the file has no line) or "missing" (no file at all)
    lines: int = 0
    steps: int = 0  # step lines logged
    last_step: int | None = None
    last_loss: float | None = None
    mean_tokens_per_s: float | None = None
    problems: int = 0  # lines that say error/warning/failed


def summarize(rank: int, lines: list[LogLine]) -> RankSummary:
    steps = [m for line in lines if (m := STEP.match(line.message))]
    rates = [float(m["tps"].replace(",", "")) for m in steps]
    return RankSummary(
        rank=rank,
        status="ok" if lines else "empty",
        lines=len(lines),
        steps=len(steps),
        last_step=int(steps[-1]["step"]) if steps else None,
        last_loss=float(steps[-1]["loss"]) if steps else None,
        mean_tokens_per_s=sum(rates) / len(rates) if rates else None,
        problems=sum(bool(PROBLEM.search(line.message)) for line in lines),
    )


def merge(log_dir: str | Path) -> tuple[list[LogLine], list[RankSummary]]:
    """All lines of all ranks in time order (ties keep rank, then file order), and a
    summary per rank of the world, including the ranks that left no log."""
    per_rank = {rank: read_rank_log(path, rank) for rank, path in find_logs(Path(log_dir)).items()}
    world = max([line.world_size for lines in per_rank.values() for line in lines] or [0])
    world = max(world, max(per_rank) + 1)
    summaries = [
        summarize(rank, per_rank[rank])
        if rank in per_rank
        else RankSummary(rank=rank, status="missing")
        for rank in range(world)
    ]
    timeline = sorted(
        (line for lines in per_rank.values() for line in lines), key=lambda line: line.time
    )
    return timeline, summaries


# --8<-- [end:merge]


# --8<-- [start:format]
def format_timeline(timeline: list[LogLine]) -> list[str]:
    return [
        f"{line.time:%H:%M:%S}.{line.time.microsecond // 1000:03d} [rank {line.rank}] {line.message}"
        for line in timeline
    ]


def format_table(summaries: list[RankSummary]) -> list[str]:
    def show(value: float | int | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    rows = [
        "| rank | status | lines | step lines | last step | last loss | mean tokens/s | errors/warnings |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        rows.append(
            f"| {s.rank} | {s.status} | {s.lines} | {s.steps} | {show(s.last_step, 'd')} | "
            f"{show(s.last_loss, '.4f')} | {show(s.mean_tokens_per_s, ',.0f')} | {s.problems} |"
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("log_dir", help="the run's --log-dir: it holds rank_<N>/train.log")
    p.add_argument("--summary", action="store_true", help="the per-rank table only")
    args = p.parse_args(argv)
    timeline, summaries = merge(args.log_dir)
    if not args.summary:
        print("\n".join(format_timeline(timeline)))
        print()
    print("\n".join(format_table(summaries)))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
# --8<-- [end:format]
