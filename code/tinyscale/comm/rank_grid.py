# --8<-- [start:header]
"""A rank grid: N ranks arranged as data x pipeline x tensor, one process group per line.

    python -m tinyscale.comm.rank_grid --dp 2 --pp 2 --tp 2

2D and 3D parallelism give every rank a coordinate (d, p, t) on a grid whose sizes
multiply to the world size. Ranks that differ only in one coordinate form a group along
that axis: a tensor-parallel group shares the layers' matrices, a pipeline group passes
activations, a data-parallel group averages gradients. The tensor axis is innermost, so
that a tensor group is made of consecutive ranks: on GPUs, the GPUs of one node, joined
by NVLink. PyTorch's DeviceMesh is this grid; here it is built first from dist.new_group.
This from-scratch grid puts data outermost; the course's scripts use the one layout of
every degree, tinyscale.comm.parallel_layout, which puts the pipeline outermost (torchtitan's
order) and builds its groups the same way, with the job's timeout.
"""

import dataclasses
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from tinyscale.comm.parallel_layout import job_timeout, new_subgroup
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli

AXES = ("dp", "pp", "tp")  # outermost first: tp varies fastest along the ranks

# --8<-- [end:header]


# --8<-- [start:grid]
@dataclasses.dataclass(frozen=True, kw_only=True)
class RankGrid:
    dp: int = 1  # data-parallel replicas (or FSDP shards)
    pp: int = 1  # pipeline stages
    tp: int = 1  # tensor-parallel ranks, consecutive

    def __post_init__(self) -> None:
        for axis in AXES:
            if getattr(self, axis) < 1:
                raise UsageError(f"--{axis} must be at least 1, got {getattr(self, axis)}")

    @property
    def size(self) -> int:
        return self.dp * self.pp * self.tp

    def check_world(self, world_size: int) -> None:
        if self.size != world_size:
            raise UsageError(
                f"a dp {self.dp} x pp {self.pp} x tp {self.tp} grid is {self.size} ranks but "
                f"the world has {world_size}: make dp x pp x tp = {world_size}"
            )

    def coordinate(self, rank: int) -> dict[str, int]:
        """Where ``rank`` sits: rank = (d * pp + p) * tp + t."""
        d, rest = divmod(rank, self.pp * self.tp)
        p, t = divmod(rest, self.tp)
        return {"dp": d, "pp": p, "tp": t}

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along ``axis``: the ranks whose other coordinates are equal."""
        if axis not in AXES:
            raise UsageError(f"unknown axis {axis!r}: use one of {', '.join(AXES)}")
        others = [a for a in AXES if a != axis]
        lines: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.size):
            where = self.coordinate(rank)
            lines.setdefault(tuple(where[a] for a in others), []).append(rank)
        return list(lines.values())

    def group_of(self, axis: str, rank: int) -> list[int]:
        return next(g for g in self.groups(axis) if rank in g)


# --8<-- [end:grid]


# --8<-- [start:new_groups]
def new_groups(grid: RankGrid) -> dict[str, dist.ProcessGroup]:
    """This rank's process group along each axis, from dist.new_group (``new_subgroup``).

    new_group is collective over the *whole* world: every rank must create every group,
    in the same order, even the groups it is not in. A rank that skips one waits for the
    others until the timeout: each group gets the job's (the world group's), not the
    backend's default of 30 minutes.
    """
    grid.check_world(dist.get_world_size())
    timeout = job_timeout()
    return {axis: new_subgroup(grid.groups(axis), timeout) for axis in AXES}


def device_mesh(grid: RankGrid, groups: dict[str, dist.ProcessGroup], device_type: str = "cpu"):
    """The same grid as PyTorch's DeviceMesh, over these groups: mesh["tp"] is groups["tp"]."""
    ranks = torch.arange(grid.size).reshape(grid.dp, grid.pp, grid.tp)
    mine = [groups[axis] for axis in AXES]
    return DeviceMesh.from_group(mine, device_type, mesh=ranks, mesh_dim_names=AXES)


# --8<-- [end:new_groups]


# --8<-- [start:demo]
def table(grid: RankGrid) -> list[str]:
    """One row per rank: its coordinate and the members of its group on each axis."""
    header = "  ".join(f"{a} group".ljust(14) for a in AXES)
    lines = [f"rank  {'(dp, pp, tp)':<13}  {header}".rstrip()]
    for rank in range(grid.size):
        where = grid.coordinate(rank)
        members = "  ".join(str(grid.group_of(a, rank)).ljust(14) for a in AXES)
        lines.append(f"{rank:>4}  {tuple(where.values())!s:<13}  {members}".rstrip())
    return lines


def groups_on_ranks(dp: int, pp: int, tp: int) -> dict[str, list[int]]:
    """On each rank: the members of its groups, from new_group and from the DeviceMesh."""
    grid = RankGrid(dp=dp, pp=pp, tp=tp)
    ours = new_groups(grid)
    mesh = device_mesh(grid, ours)
    found = {}
    for axis in AXES:
        from_new_group = dist.get_process_group_ranks(ours[axis])
        from_mesh = mesh[axis].mesh.tolist()  # the mesh's own rank table, cut along axis
        if from_new_group != from_mesh:
            raise AssertionError(f"{axis}: new_group {from_new_group}, DeviceMesh {from_mesh}")
        found[axis] = from_new_group
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(description="Print the process groups of a dp x pp x tp grid.")
    for axis in AXES:
        parser.add_argument(f"--{axis}", type=int, default=1)
    parser.add_argument("--run", action="store_true", help="build the groups on gloo ranks too")
    args = parser.parse_args(argv)
    grid = RankGrid(dp=args.dp, pp=args.pp, tp=args.tp)
    print("\n".join(table(grid)))
    if args.run:
        from tinyscale.comm.launch import run_on_ranks

        found = run_on_ranks(groups_on_ranks, grid.size, grid.dp, grid.pp, grid.tp)
        same = all(found[r][a] == grid.group_of(a, r) for r in range(grid.size) for a in AXES)
        print(f"{grid.size} ranks built every group with new_group and with DeviceMesh: "
              f"{'the same members as the table' if same else 'DIFFERENT members'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))

# --8<-- [end:demo]
