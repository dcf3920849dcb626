"""tinyscale.comm.parallel_layout: the one layout of every degree, its mesh and its groups.

On paper: the axis order (torchtitan's, read from the installed torchtitan), the
coordinates, the groups, and the one-line errors that name the fix. On 4 gloo ranks (one
launch): every group made once, the mesh over those very groups, each with the job's
timeout. And the stall the timeouts exist for: a 2 x 2 job (pp 2 x dp 2) whose rank 3
stops (SIGSTOP); its partners raise after the 2 s timeout, not gloo's 30 minutes.
"""

import inspect
import math
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout
from torchtitan.distributed import parallel_dims

from helpers import TIMEOUTS, one_line_error, prose, said
from tinyscale.comm.launch import run_on_ranks
from tinyscale.comm.parallel_layout import (
    AXES,
    FLAGS,
    ParallelLayout,
    job_timeout,
    main,
    stall,
    table,
)
from tinyscale.core.errors import run_cli

PAGE = "week-4/parallelism-2d-3d.md"
TIMEOUT_S = 2.0  # each group's, in the stall test: small, so the test costs seconds
MARGIN_S = 1.5  # a loaded CI machine wakes a rank late, never by this much


def test_the_axes_are_torchtitans_order_outermost_first() -> None:
    assert AXES == ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    assert '("pp", "dp_replicate", "dp_shard", "cp", "tp")' in inspect.getsource(parallel_dims)


def test_tensor_groups_are_neighbours_and_pipelines_are_strided() -> None:
    layout = ParallelLayout(pp=2, dp_replicate=2, tp=2)
    assert layout.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.groups("dp_replicate") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.groups("cp") == [[r] for r in range(8)]  # degree 1: a group of one


@pytest.mark.parametrize(
    "degrees",
    [
        dict(pp=2, dp_replicate=2, tp=2),
        dict(dp_shard=4),
        dict(pp=3, cp=2, tp=2),
        dict(dp_replicate=2, dp_shard=3, tp=1),
        dict(),
    ],
)
def test_each_axis_partitions_the_ranks_and_coordinates_are_mixed_radix(degrees) -> None:
    layout = ParallelLayout(**degrees)
    assert layout.world_size == math.prod(degrees.values())
    for axis in AXES:
        groups = layout.groups(axis)
        assert sorted(r for g in groups for r in g) == list(range(layout.world_size))
        assert all(len(g) == layout.degrees[axis] for g in groups)
    for rank in range(layout.world_size):
        where, back = layout.coordinate(rank), 0
        assert list(where) == list(AXES)
        for axis in AXES:  # outermost first: rank = ((p * R + r) * S + s) * C + c) * T + t
            back = back * layout.degrees[axis] + where[axis]
        assert back == rank


def test_data_ranks_number_the_copies_and_shards_only() -> None:
    layout = ParallelLayout(pp=2, dp_replicate=2, dp_shard=2, tp=2)
    assert layout.data_parallel == 4
    shares = [layout.data_rank(r) for r in range(layout.world_size)]
    assert shares[:8] == [0, 0, 1, 1, 2, 2, 3, 3] and shares[8:] == shares[:8]  # pp, tp: same


def test_table_lists_every_rank_with_its_groups() -> None:
    lines = table(ParallelLayout(pp=2, dp_replicate=2))
    assert lines[0].split() == ["rank", "(pp,", "dp_replicate)", "pp", "group", "dp_replicate",
                                "group"]  # fmt: skip
    assert lines[4].split() == ["3", "(1,", "1)", "[1,", "3]", "[2,", "3]"]
    assert len(lines) == 5


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ParallelLayout(tp=0), "--tp 0 is not a number of ranks: give a whole number"),
        (lambda: ParallelLayout(pp=-2), "--pp -2 is not a number of ranks"),
        (lambda: ParallelLayout(dp_shard=1.5), "--fsdp 1.5 is not a number of ranks"),
        (lambda: ParallelLayout(dp_replicate=True), "--dp True is not a number of ranks"),
        (lambda: ParallelLayout(pp=2, dp_replicate=2, tp=2).validate(4),
         "--pp 2 --dp 2 --tp 2 give 8 ranks but the job has 4: make the product of the "
         "degrees equal the number of processes (--nproc-per-node x --nnodes)"),
        (lambda: ParallelLayout(tp=2).validate(4), "--tp 2 gives 2 ranks but the job has 4"),
        (lambda: ParallelLayout().validate(2), "degrees of 1 give 1 rank but the job has 2"),
        (lambda: ParallelLayout(dp_shard=2, tp=2, ep=3),
         "--ep 3 does not divide --fsdp x --cp x --tp = 4, the ranks the experts are spread"),
        (lambda: ParallelLayout.filling(6, pp=4),
         "--pp 4 does not divide the world of 6 processes: pick a divisor of --nproc-per-node "
         "x --nnodes (--dp takes the ranks that are left)"),
        (lambda: ParallelLayout().groups("dp"), "unknown axis 'dp': use one of pp, dp_replicate"),
    ],
)  # fmt: skip
def test_bad_layouts_are_one_line_naming_the_fix(make, message) -> None:
    assert one_line_error(make).startswith(message)


def test_filling_gives_the_rest_to_one_axis() -> None:
    assert ParallelLayout.filling(8, pp=2) == ParallelLayout(pp=2, dp_replicate=4)
    assert ParallelLayout.filling(8, "dp_shard", tp=2) == ParallelLayout(dp_shard=4, tp=2)


def test_every_degree_has_one_flag() -> None:
    assert set(FLAGS) == {*AXES, "ep"} and len(set(FLAGS.values())) == len(FLAGS)
    assert ParallelLayout(pp=2, dp_shard=4, tp=2).flags() == "--pp 2 --fsdp 4 --tp 2"


def test_the_command_line_refuses_a_rank_outside_the_layout(capsys) -> None:
    assert run_cli(main, ["--dp", "2", "--stall", "2"]) == 2
    assert capsys.readouterr().err == "error: --stall 2 is not a rank of 2: pick one in 0..1\n"


def built_once() -> dict:
    """On each rank: what building a dp_replicate 2 x dp_shard 2 layout made, and its
    timeouts."""
    before = dist.get_pg_count()
    layout = ParallelLayout(dp_replicate=2, dp_shard=2)
    built = layout.build(timeout_s=7)
    made = dist.get_pg_count() - before
    data_mesh = built.mesh["dp_replicate", "dp_shard"]  # slicing makes no group
    sliced = dist.get_pg_count() - before
    tied = built.subgroup([[0, 3], [1, 2]])
    cpu = torch.device("cpu")
    return {
        "made": made,
        "after_slicing": sliced,
        "members": {a: dist.get_process_group_ranks(built.group(a)) for a in AXES},
        "mesh_is_ours": data_mesh.get_group("dp_shard") is built.group("dp_shard"),
        "timeouts": {a: built.group(a)._get_backend(cpu).options._timeout for a in AXES},
        "tied": (dist.get_process_group_ranks(tied), tied._get_backend(cpu).options._timeout),
        "job": job_timeout(),
    }


@pytest.fixture(scope="module")
def four_ranks() -> list[dict]:
    return run_on_ranks(built_once, 4, timeout_s=9, deadline_s=TIMEOUTS["deadline_s"])


def test_every_group_is_made_once_and_the_mesh_is_made_of_them(four_ranks) -> None:
    layout = ParallelLayout(dp_replicate=2, dp_shard=2)
    groups_of_every_axis = sum(len(layout.groups(a)) for a in AXES)  # every rank makes all
    for rank, facts in enumerate(four_ranks):
        assert facts["made"] == groups_of_every_axis == 16
        assert facts["after_slicing"] == groups_of_every_axis
        assert facts["members"] == {a: layout.group_of(a, rank) for a in AXES}
        assert facts["mesh_is_ours"]


def test_every_group_carries_the_jobs_timeout(four_ranks) -> None:
    for rank, facts in enumerate(four_ranks):
        assert set(facts["timeouts"].values()) == {timedelta(seconds=7)}  # build(timeout_s=7)
        assert facts["tied"] == ([0, 3] if rank in (0, 3) else [1, 2], timedelta(seconds=7))
        assert facts["job"] == timedelta(seconds=9)  # run_on_ranks(timeout_s=9): the world's


def test_a_stopped_rank_fails_its_partners_within_the_timeout() -> None:
    """pp 2 x dp 2; rank 3 stops. Its pp partner (1) and its dp partner (2) raise after
    TIMEOUT_S; the groups without rank 3 finish; nobody waits for gloo's 30 minutes."""
    layout = ParallelLayout(pp=2, dp_replicate=2)
    start = time.monotonic()
    found = run_on_ranks(stall, 4, layout, 3, TIMEOUT_S, timeout_s=TIMEOUT_S, deadline_s=60)
    assert time.monotonic() - start < 60
    assert found[3] == {}  # the stopped rank, woken up after the others gave up
    for rank in (0, 1, 2):
        for axis, (seconds, error) in found[rank].items():
            if 3 in layout.group_of(axis, rank):
                assert error == f"Timed out waiting {TIMEOUT_S * 1000:.0f}ms for recv operation "\
                                "to complete", (rank, axis, error)  # fmt: skip
                assert TIMEOUT_S - 0.1 < seconds < TIMEOUT_S + MARGIN_S, (rank, axis, seconds)
            else:
                assert error is None and seconds < TIMEOUT_S + MARGIN_S, (rank, axis, error)
    assert sum(error is not None for facts in found for _, error in facts.values()) == 2


def test_the_page_says_what_a_group_without_a_timeout_waits() -> None:
    (minutes,) = said(prose(PAGE), r"keeps the backend's default, (\d+) minutes on gloo")
    assert timedelta(minutes=int(minutes)) == default_pg_timeout
