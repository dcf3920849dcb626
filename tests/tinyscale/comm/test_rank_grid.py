"""tinyscale.comm.rank_grid: the dp x pp x tp grid, its groups, and the same groups built by
dist.new_group and by DeviceMesh on 4 gloo ranks (the 2D page runs it with --run)."""

import pytest

from tinyscale.comm.launch import run_on_ranks
from tinyscale.comm.rank_grid import AXES, RankGrid, groups_on_ranks, main, table
from tinyscale.core.errors import UsageError, run_cli


def test_tensor_groups_are_consecutive_ranks() -> None:
    grid = RankGrid(dp=2, pp=2, tp=2)
    assert grid.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.groups("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize("shape", [(2, 2, 2), (1, 4, 2), (4, 1, 2), (3, 2, 1)])
def test_each_axis_partitions_the_ranks_and_coordinates_invert(shape) -> None:
    grid = RankGrid(dp=shape[0], pp=shape[1], tp=shape[2])
    for axis, size in zip(AXES, shape, strict=True):
        groups = grid.groups(axis)
        assert sorted(r for g in groups for r in g) == list(range(grid.size))  # each rank once
        assert all(len(g) == size for g in groups)
    for rank in range(grid.size):
        c = grid.coordinate(rank)
        assert (c["dp"] * grid.pp + c["pp"]) * grid.tp + c["tp"] == rank


def test_table_lists_every_rank_with_its_groups() -> None:
    lines = table(RankGrid(dp=2, pp=2, tp=2))
    assert len(lines) == 9
    assert lines[6].split() == ["5", "(1,", "0,", "1)", "[1,", "5]", "[5,", "7]", "[4,", "5]"]


def test_groups_from_new_group_and_device_mesh_on_four_ranks() -> None:
    found = run_on_ranks(groups_on_ranks, 4, 2, 1, 2)
    grid = RankGrid(dp=2, tp=2)
    for rank, groups in enumerate(found):
        assert groups == {axis: grid.group_of(axis, rank) for axis in AXES}


def test_bad_grids_are_one_line_errors(capsys) -> None:
    with pytest.raises(UsageError, match=r"is 8 ranks but the world has 4: make dp x pp x tp = 4"):
        RankGrid(dp=2, pp=2, tp=2).check_world(4)
    with pytest.raises(UsageError, match=r"unknown axis 'xp': use one of dp, pp, tp"):
        RankGrid().groups("xp")
    assert run_cli(main, ["--tp", "0"]) == 2
    assert capsys.readouterr().err == "error: --tp must be at least 1, got 0\n"
