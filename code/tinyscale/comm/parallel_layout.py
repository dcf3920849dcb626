# --8<-- [start:header]
"""The parallel layout: every degree of a job in one object, its mesh and groups built once.

Try it:  python -m tinyscale.comm.parallel_layout --pp 2 --dp 2 --tp 2
Launch:  torchrun --standalone --nproc-per-node 4 code/scripts/parallel_train.py --fsdp 2 --tp 2

A job of N ranks is cut along five axes, outermost first: pipeline stages (pp), model
copies (dp_replicate), ranks that share one copy's shards (dp_shard, FSDP), ranks that
share one sequence's positions (cp, context) and ranks that share each layer's matrices
(tp). The degrees multiply to N; degree 1 turns an axis off. This is torchtitan's order
(its ParallelDims), chosen by how often each axis talks. tp is innermost: it talks inside
every block, so its ranks must be neighbours, the GPUs of one node joined by NVLink, and
torchrun numbers a node's GPUs consecutively. pp is outermost: a stage boundary sends one
activation per micro-batch, the lightest traffic, so it is the one that crosses the
network. Expert parallelism (ep) is no axis of its own: as in torchtitan, it spreads the
experts over the ranks of dp_shard x cp x tp, so its degree divides theirs (room for MoE;
no lesson composes it yet; 1 = off).

Every group is made by dist.new_group with the job's timeout. A group made without one
keeps the backend's default (30 minutes on gloo): a rank that stops would hang its
partners for half an hour, whatever timeout the world group was given.
"""

import dataclasses
import math
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from tinyscale.core.errors import ArgumentParser, UsageError, run_cli

AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")  # outermost first: tp varies fastest
# The flag that sets each degree, in every script of the course (and in error messages)
FLAGS = {"pp": "--pp", "dp_replicate": "--dp", "dp_shard": "--fsdp", "cp": "--cp", "tp": "--tp",
         "ep": "--ep"}  # fmt: skip

# --8<-- [end:header]


# --8<-- [start:layout]
@dataclasses.dataclass(frozen=True, kw_only=True)
class ParallelLayout:
    """Every degree of a job, in AXES order; checked when made, and against the job's size."""

    pp: int = 1  # pipeline stages
    dp_replicate: int = 1  # model copies, each trained on its share of the batch
    dp_shard: int = 1  # ranks that share one copy's shards (FSDP, ZeRO-3)
    cp: int = 1  # ranks that share one sequence's positions (context parallel)
    tp: int = 1  # ranks that share every layer's matrices (tensor parallel)
    ep: int = 1  # experts spread over dp_shard x cp x tp: no axis of its own

    def __post_init__(self) -> None:
        for name in (*AXES, "ep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{FLAGS[name]} {value!r} is not a number of ranks: give a "
                                 "whole number >= 1 (1 turns the axis off)")  # fmt: skip
        spread = self.dp_shard * self.cp * self.tp
        if spread % self.ep:
            raise UsageError(
                f"--ep {self.ep} does not divide --fsdp x --cp x --tp = {spread}, the ranks "
                "the experts are spread over: pick an --ep that divides it"
            )

    @property
    def degrees(self) -> dict[str, int]:
        return {axis: getattr(self, axis) for axis in AXES}

    @property
    def world_size(self) -> int:
        return math.prod(self.degrees.values())

    def flags(self) -> str:
        """The flags that make this layout: "--pp 2 --dp 2 --tp 2" (degree 1 left out)."""
        given = [f"{FLAGS[a]} {n}" for a, n in self.degrees.items() if n > 1]
        return " ".join(given) or "degrees of 1"

    def by_flag(self, axes: Sequence[str] = AXES) -> dict[str, int]:
        """The degrees under their flags' names, for logs: {"pp": 1, "dp": 2, "fsdp": 2}."""
        return {FLAGS[axis].removeprefix("--"): self.degrees[axis] for axis in axes}

    @classmethod
    def from_args(cls, args: Any, axes: Sequence[str] = AXES) -> "ParallelLayout":
        """From the flags of ``add_layout_flags``: the axes a script takes, the rest 1."""
        return cls(**{axis: getattr(args, axis) for axis in axes})

    def validate(self, world_size: int) -> "ParallelLayout":
        """The degrees must use every rank of the job, each exactly once."""
        if self.world_size != world_size:
            rank_s = "rank" if self.world_size == 1 else "ranks"
            give = "gives" if sum(n > 1 for n in self.degrees.values()) == 1 else "give"
            raise UsageError(
                f"{self.flags()} {give} {self.world_size} {rank_s} but the job has {world_size}: "
                "make the product of the degrees equal the number of processes "
                "(--nproc-per-node x --nnodes)"
            )
        return self

    @classmethod
    def filling(cls, world_size: int, axis: str = "dp_replicate", **given: int) -> "ParallelLayout":
        """The ``given`` degrees, and ``axis`` takes the ranks that are left (torchtitan's -1)."""
        used = math.prod(ParallelLayout(**given).degrees.values())  # each checked >= 1
        if world_size % used:
            named = " x ".join(f"{FLAGS[a]} {n}" for a, n in given.items())
            raise UsageError(
                f"{named} does not divide the world of {world_size} processes: pick a divisor "
                f"of --nproc-per-node x --nnodes ({FLAGS[axis]} takes the ranks that are left)"
            )
        return cls(**given, **{axis: world_size // used}).validate(world_size)

    # --8<-- [end:layout]

    # --8<-- [start:coordinates]
    def coordinate(self, rank: int) -> dict[str, int]:
        """Where ``rank`` sits on each axis: its digits in the mixed radix of the degrees."""
        where = {}
        for axis in reversed(AXES):  # the innermost axis is the fastest-varying digit
            rank, where[axis] = divmod(rank, self.degrees[axis])
        return {axis: where[axis] for axis in AXES}

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along ``axis``: the ranks whose coordinates differ on ``axis`` only."""
        if axis not in AXES:
            raise UsageError(f"unknown axis {axis!r}: use one of {', '.join(AXES)}")
        lines: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.world_size):
            where = self.coordinate(rank)
            lines.setdefault(tuple(n for a, n in where.items() if a != axis), []).append(rank)
        return list(lines.values())

    def group_of(self, axis: str, rank: int) -> list[int]:
        return next(g for g in self.groups(axis) if rank in g)

    @property
    def data_parallel(self) -> int:
        """Into how many shares the global batch is cut: one per copy and shard."""
        return self.dp_replicate * self.dp_shard

    def data_rank(self, rank: int) -> int:
        """Which share of the batch ``rank`` reads (its pp, cp and tp partners read it too)."""
        where = self.coordinate(rank)
        return where["dp_replicate"] * self.dp_shard + where["dp_shard"]

    # --8<-- [end:coordinates]

    # --8<-- [start:build]
    def build(self, *, device_type: str = "cpu", timeout_s: float | None = None) -> "ParallelMesh":
        """Every group of every axis, once, with the job's timeout, and the mesh over them.

        init_device_mesh would make groups of its own, with the backend's default timeout;
        DeviceMesh.from_group takes ours. A degree-1 axis costs a group of one rank per
        rank, which never talks; having every axis lets a caller ask for any of them.
        """
        self.validate(dist.get_world_size())
        timeout = job_timeout() if timeout_s is None else timedelta(seconds=timeout_s)
        mine = [new_subgroup(self.groups(axis), timeout) for axis in AXES]
        ranks = torch.arange(self.world_size).reshape(tuple(self.degrees.values()))
        mesh = DeviceMesh.from_group(mine, device_type, mesh=ranks, mesh_dim_names=AXES)
        return ParallelMesh(layout=self, mesh=mesh, timeout=timeout)


def job_timeout() -> timedelta:
    """The world group's timeout: what the job was started with (``--timeout-s``)."""
    # torch has no public getter: the backend's options hold what init_process_group got
    device = torch.device("cuda" if dist.get_backend() == "nccl" else "cpu")
    return dist.group.WORLD._get_backend(device).options._timeout


def new_subgroup(lines: Sequence[Sequence[int]], timeout: timedelta) -> Any:
    """This rank's group among ``lines``, each a group of ranks, all with ``timeout``.

    new_group is collective over the *whole* world: every rank creates every group, in the
    same order, even those it is not in. Returns None where this rank is in none.
    """
    mine = None
    for ranks in lines:
        group = dist.new_group(list(ranks), timeout=timeout)  # every rank, every group
        if dist.get_rank() in ranks:
            mine = group
    return mine


@dataclasses.dataclass(frozen=True)
class ParallelMesh:
    """A layout built on the ranks of a job: one DeviceMesh over the course's own groups."""

    layout: ParallelLayout
    mesh: DeviceMesh  # every axis, degree 1 too: mesh["tp"], mesh["dp_replicate", "dp_shard"]
    timeout: timedelta

    def group(self, axis: str) -> dist.ProcessGroup:
        return self.mesh.get_group(axis)

    def subgroup(self, lines: Sequence[Sequence[int]]) -> Any:
        """A group across the axes (the tied embedding's pairs), with the same timeout."""
        return new_subgroup(lines, self.timeout)


# --8<-- [end:build]


# --8<-- [start:flags]
def add_layout_flags(parser: Any, axes: Sequence[str] = AXES, **defaults: int) -> None:
    """One flag per degree a script takes, named as everywhere in the course."""
    helps = {"pp": "pipeline stages", "dp_replicate": "model copies (replicated)",
             "dp_shard": "ranks sharing one copy (FSDP)", "cp": "ranks sharing a sequence",
             "tp": "tensor-parallel ranks"}  # fmt: skip
    for axis in axes:
        parser.add_argument(FLAGS[axis], dest=axis, type=int, default=defaults.get(axis, 1),
                            help=f"{helps[axis]}; the degrees' product = the ranks")  # fmt: skip


# --8<-- [end:flags]


# --8<-- [start:demo]
def table(layout: ParallelLayout) -> list[str]:
    """One row per rank: its coordinate and its group on each axis of degree > 1."""
    axes = [a for a, n in layout.degrees.items() if n > 1] or ["tp"]
    where_title = f"({', '.join(axes)})"
    width = [max(13, len(where_title)), *(max(14, len(f"{a} group")) for a in axes)]
    rows = [["rank", where_title, *(f"{a} group" for a in axes)]]
    for rank in range(layout.world_size):
        where = layout.coordinate(rank)
        place = str(tuple(where[a] for a in axes)).replace(",)", ")")
        rows.append([f"{rank:>4}", place, *(str(layout.group_of(a, rank)) for a in axes)])
    return ["  ".join([r[0], *(c.ljust(w) for c, w in zip(r[1:], width, strict=True))]).rstrip()
            for r in rows]  # fmt: skip


def stall(layout: ParallelLayout, stopped: int, timeout_s: float) -> dict[str, tuple]:
    """On each rank: build the layout; then rank ``stopped`` stops (SIGSTOP) and every other
    rank all-reduces in each of its groups at once. Returns, per axis of degree > 1, the
    seconds this rank waited and gloo's error (None: done). A shell wakes the stopped rank
    once its partners have given up."""
    built, rank = layout.build(timeout_s=timeout_s), dist.get_rank()
    dist.barrier()  # every rank has made every group
    if rank == stopped:
        subprocess.Popen(["sh", "-c", f"sleep {2 * timeout_s + 1}; kill -CONT {os.getpid()}"])
        os.kill(os.getpid(), signal.SIGSTOP)
        return {}
    axes = [a for a, n in layout.degrees.items() if n > 1]
    start = time.monotonic()
    works = {a: dist.all_reduce(torch.ones(1), group=built.group(a), async_op=True) for a in axes}
    found = {}
    for axis, work in works.items():
        try:
            work.wait()
            found[axis] = (time.monotonic() - start, None)
        except RuntimeError as err:  # gloo's message, less the source file it comes from
            found[axis] = (time.monotonic() - start, str(err).split("] ")[-1])
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(description="Print a layout's ranks and groups, or stop a rank.")
    add_layout_flags(parser)
    parser.add_argument(
        "--stall",
        type=int,
        default=None,
        metavar="RANK",
        help="build it on gloo ranks, stop RANK, see its partners time out",
    )
    parser.add_argument("--timeout-s", type=float, default=2.0, help="every group's timeout")
    args = parser.parse_args(argv)
    layout = ParallelLayout.from_args(args)
    if args.stall is not None and not 0 <= args.stall < layout.world_size:
        raise UsageError(f"--stall {args.stall} is not a rank of {layout.world_size}: "
                         f"pick one in 0..{layout.world_size - 1}")  # fmt: skip
    print("\n".join(table(layout)))
    if args.stall is None:
        return 0
    from tinyscale.comm.launch import run_on_ranks

    found = run_on_ranks(stall, layout.world_size, layout, args.stall, args.timeout_s,
                         timeout_s=args.timeout_s, deadline_s=60)  # fmt: skip
    print(f"rank {args.stall} stopped; every group has a {args.timeout_s:g} s timeout")
    for rank, axes in enumerate(found):
        said = [f"{a} {layout.group_of(a, rank)} " + ("done" if error is None else
                f"raised {'within' if seconds < args.timeout_s + 1 else 'AFTER'} the timeout + 1 s: "
                f"{error}") for a, (seconds, error) in axes.items()]  # fmt: skip
        print(f"rank {rank}: {', '.join(said) or 'stopped, then woken up'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))

# --8<-- [end:demo]
