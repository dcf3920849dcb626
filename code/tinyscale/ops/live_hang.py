# --8<-- [start:header]
"""A live hang to look at: one rank blocked in an all-reduce while the other is elsewhere.

Launch:  python -m tinyscale.ops.live_hang --seconds 60

Starts 2 gloo ranks. Rank 0 writes its pid to a file and waits in an all-reduce; rank 1
sleeps for ``--seconds`` (a rank stuck in I/O or a long compilation) before it joins. In
the meantime ``py-spy dump --pid`` shows where rank 0 waits. The scenarios of
tinyscale.ops.hangs end in a timeout; this one sits still, as a real hang does, until
rank 1 comes or the launcher is stopped.
"""

import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli

# --8<-- [end:header]


# --8<-- [start:hang]
def stop_on_sigterm() -> None:
    """`kill <pid>` ends this launcher through its ``finally`` blocks: run_on_ranks then
    stops the ranks it started, instead of leaving them behind."""

    def leave(signum: int, frame: Any) -> None:
        raise SystemExit(f"stopped by signal {signum}: the ranks were ended too")

    signal.signal(signal.SIGTERM, leave)


def blocked_rank(pid_file: str, seconds: float) -> None:
    """Rank 0 writes its pid and waits in an all-reduce; rank 1 is elsewhere for ``seconds``."""
    if dist.get_rank() == 0:
        tmp = Path(f"{pid_file}.tmp")
        tmp.write_text(str(os.getpid()))
        tmp.replace(pid_file)
        dist.all_reduce(torch.ones(4))  # waits here: look at it with py-spy dump
    else:
        time.sleep(seconds)  # stands for a rank stuck in I/O or a long compilation
        dist.all_reduce(torch.ones(4))


# --8<-- [end:hang]


# --8<-- [start:main]
def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long rank 1 is away")
    parser.add_argument("--pid-file", type=Path, default=Path("runs/live_hang/blocked.pid"))
    args = parser.parse_args(argv)
    if not 0 < args.seconds <= 600:
        raise UsageError(f"--seconds {args.seconds:g}: use more than 0 and at most 600")
    args.pid_file.parent.mkdir(parents=True, exist_ok=True)
    stop_on_sigterm()
    # Every collective may wait a little longer than rank 1 is away: no timeout fires.
    run_on_ranks(blocked_rank, 2, str(args.pid_file), args.seconds,
                 timeout_s=args.seconds + 30, deadline_s=args.seconds + 60)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
# --8<-- [end:main]
