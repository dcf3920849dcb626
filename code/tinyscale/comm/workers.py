# --8<-- [start:header]
"""N persistent workers in one process group, driven cell by cell from a notebook.

    python -c "from tinyscale.comm.workers import demo; demo()"

``run_on_ranks`` starts fresh processes for every call. To *explore* collectives you
want them to stay: start N workers once, send each a cell of code, see what every rank
printed, send the next cell — the names a cell defines are still there. That is what
nbdistributed does with ZMQ; this module does it with what the course already has:
``multiprocessing`` (started as ``run_on_ranks`` starts ranks), one pipe per worker and
a gloo process group. ``close()`` ends only the processes this pool started, by pid.
"""

import ast
import contextlib
import gc
import io
import os
import re
import time
import traceback
import weakref
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from tinyscale.comm.launch import adopt_environment, free_port, process_context
from tinyscale.core.errors import UsageError

GRACE_S = 2.0  # a cell's deadline is the collective timeout plus this: the timeout fires first
START_TIMEOUT_S = 120.0  # spawning N workers that each import torch, on a busy laptop

# --8<-- [end:header]


# --8<-- [start:errors]
class CellError(RuntimeError):
    """A cell raised on some rank, or hung; ``outputs`` holds what each rank printed."""

    def __init__(self, message: str, outputs: list[str]) -> None:
        super().__init__(message)
        self.outputs = outputs

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of a traceback: the one line that says what to do.
        return [f"CellError: {self}"]


# --8<-- [end:errors]


# --8<-- [start:worker]
def _serve(
    rank: int, world_size: int, port: int, timeout_s: float, conn: Any, environ: dict[str, str]
) -> None:
    """One worker: join the group, then run every cell it is sent in one namespace."""
    adopt_environment(environ)
    torch.set_num_threads(1)  # N workers share the cores
    conn.send(("imported", os.getpid()))  # torch is loaded; wait until every rank is
    if conn.recv() != "init":
        return
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),  # a collective whose peers never come fails
    )
    namespace = {"torch": torch, "dist": dist, "rank": rank, "world_size": world_size}
    conn.send(("ready", ""))
    while True:
        try:
            code = conn.recv()
        except EOFError:  # the notebook went away without close(): leave too
            break
        if code is None:  # close()
            break
        conn.send(_run_cell(code, namespace))
    namespace.clear()  # the cells' objects go first, while Python is fully alive
    gc.collect()
    dist.destroy_process_group()


# --8<-- [end:worker]


# --8<-- [start:run_cell]
def _run_cell(code: str, namespace: dict[str, Any]) -> tuple[str, str, str]:
    """Run one cell like Jupyter does: print the value of a last bare expression.

    Returns (status, output, error): status is "ok", "error", or "collective" when the
    exception came from torch.distributed (a timeout, a lost peer).
    """
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            tree = ast.parse(code)
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, "<cell>", "exec"), namespace)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
                if value is not None:
                    print(repr(value))
        except Exception as exc:
            line = traceback.format_exception_only(exc)[-1].strip().splitlines()[0]
            line = re.sub(r"\[\S+\.cc:\d+\] ", "", line)  # gloo's C++ source location
            return ("collective" if _from_dist(exc) else "error"), out.getvalue(), line
    return "ok", out.getvalue(), ""


def _from_dist(exc: BaseException) -> bool:
    """Did the exception escape from inside torch.distributed (a timeout, a lost peer)?"""
    where = os.sep + os.path.join("torch", "distributed") + os.sep
    return any(where in frame.filename for frame in traceback.extract_tb(exc.__traceback__))


# --8<-- [end:run_cell]


# --8<-- [start:pool]
class WorkerPool:
    """``world_size`` worker processes in one gloo group, each with its own namespace.

    Every namespace starts with ``torch``, ``dist``, ``rank`` and ``world_size``. A cell
    that waits in a collective its peers never call fails after ``timeout_s`` with one
    line; the group cannot be trusted after that (gloo's message counters no longer
    agree), so the pool shuts its workers down and a new pool starts clean.
    """

    def __init__(self, world_size: int = 4, *, timeout_s: float = 10.0) -> None:
        if world_size < 1:
            raise UsageError(f"world_size must be at least 1, got {world_size}: use 2 or 4")
        if timeout_s <= 0:
            raise UsageError(f"timeout_s must be positive, got {timeout_s}: use e.g. 10")
        self.world_size, self.timeout_s = world_size, timeout_s
        ctx = process_context()  # plain fork would copy a notebook kernel's threads
        port = free_port()
        self._conns, self._procs = [], []
        for rank in range(world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_serve,
                args=(rank, world_size, port, timeout_s, child, dict(os.environ)),
                daemon=True,
            )
            proc.start()
            child.close()  # only the worker holds this end: its death closes the pipe
            self._conns.append(parent)
            self._procs.append(proc)
        # Leaving the interpreter, or dropping the pool, also ends the workers.
        self._finalizer = weakref.finalize(self, _stop, self._procs, self._conns)
        try:
            self._expect("imported", START_TIMEOUT_S)
            for conn in self._conns:
                conn.send("init")
            self._expect("ready", START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    def _expect(self, what: str, timeout_s: float) -> None:
        for rank, reply in enumerate(self._replies(timeout_s)):
            if reply is None or reply[0] != what:
                raise CellError(
                    f"rank {rank} did not start (no {what!r} within {timeout_s:g} s): see its "
                    "stderr; a script that starts a pool needs `if __name__ == '__main__':`",
                    [],
                )

    # --8<-- [end:pool]

    # --8<-- [start:run]
    def run(self, code: str) -> list[str]:
        """Run ``code`` on every rank; return what each printed, in rank order."""
        if self.closed:
            raise UsageError("this WorkerPool is closed: start a new one with WorkerPool(n)")
        for conn in self._conns:
            conn.send(code)
        replies = self._replies(self.timeout_s + GRACE_S)
        outputs = [reply[1] if reply else "" for reply in replies]
        for rank, reply in enumerate(replies):
            if reply and reply[0] != "ok":
                outputs[rank] += reply[2] + "\n"
        stuck = [rank for rank, reply in enumerate(replies) if reply is None]
        broken = [rank for rank, reply in enumerate(replies) if reply and reply[0] == "collective"]
        if stuck or broken:
            self.close()  # the group is out of step: a new pool, not a retry
            why = (
                f"ranks {stuck} gave no answer within {self.timeout_s + GRACE_S:g} s"
                if stuck
                else f"ranks {broken} failed in a collective (timed out after "
                f"{self.timeout_s:g} s, or a peer is gone)"
            )
            raise CellError(
                f"{why}: every rank must call the same collectives in the same order; "
                "the pool is closed, start a new WorkerPool",
                outputs,
            )
        failed = [(rank, reply[2]) for rank, reply in enumerate(replies) if reply[0] == "error"]
        if failed:
            rank, line = failed[0]
            raise CellError(f"rank {rank} of {self.world_size} raised {line}", outputs)
        return outputs

    def _replies(self, timeout_s: float) -> list[tuple[str, str, str] | None]:
        """One reply per rank, or None for a rank that died or missed the deadline."""
        deadline = time.monotonic() + timeout_s
        replies: list[tuple[str, str, str] | None] = []
        for conn in self._conns:
            try:
                ready = conn.poll(max(0.0, deadline - time.monotonic()))
                replies.append(tuple(conn.recv()) if ready else None)
            except (EOFError, OSError):  # the worker died: its end of the pipe closed
                replies.append(None)
        return replies

    # --8<-- [end:run]

    # --8<-- [start:print]
    def print(self, code: str) -> None:
        """Run ``code`` on every rank and print each rank's output prefixed by its rank."""
        try:
            outputs = self.run(code)
        except CellError as err:
            _print_by_rank(err.outputs)
            raise
        _print_by_rank(outputs)

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers still alive: the only processes close() ends."""
        return [proc.pid for proc in self._procs if proc.is_alive()]

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Ask every worker to leave the group; end the ones that do not, by pid."""
        self._finalizer()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _print_by_rank(outputs: list[str]) -> None:
    for rank, text in enumerate(outputs):
        for line in text.splitlines():
            print(f"[rank {rank}] {line}")


# --8<-- [end:print]


# --8<-- [start:stop]
def _stop(procs: list[Any], conns: list[Any]) -> None:
    """Say goodbye on every pipe, wait a moment, then terminate and kill what is left."""
    for conn in conns:
        with contextlib.suppress(OSError):
            conn.send(None)
    deadline = time.monotonic() + GRACE_S  # one grace period for all, not one each
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.terminate()  # SIGTERM to this pid only
            proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join()
    for conn in conns:
        conn.close()


# --8<-- [end:stop]


# --8<-- [start:magic]
def register_magic(pool: WorkerPool, name: str = "ranks") -> None:
    """Make ``%%ranks`` run a notebook cell on every worker of ``pool``."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise UsageError("register_magic needs IPython: call it in a notebook, or use pool.print")

    def ranks(line: str, cell: str) -> None:
        pool.print(cell)

    shell.register_magic_function(ranks, magic_kind="cell", magic_name=name)


# --8<-- [end:magic]


# --8<-- [start:demo]
def demo(world_size: int = 2) -> None:
    with WorkerPool(world_size) as pool:
        pool.print("t = torch.tensor([rank + 1.0])\ndist.all_reduce(t)\nprint(rank, t.item())")
        pool.print("t * 10  # the namespace persists between cells")


def fail_on_rank(bad_rank: int, how: str = "raise") -> int:
    """For the lessons: one rank raises (or dies), the others wait for it at a barrier."""
    if dist.get_rank() == bad_rank:
        if how == "exit":
            os._exit(3)  # no traceback, no result: as if the process were killed
        raise ValueError(f"rank {bad_rank} cannot go on")
    dist.barrier()
    return dist.get_rank()


# --8<-- [end:demo]
