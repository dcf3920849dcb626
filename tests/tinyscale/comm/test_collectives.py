"""tinyscale.comm.collectives and tinyscale.comm.tree_allreduce against torch.distributed (gloo).

One launch per world size (2, 3, 4) runs every collective on every shape — sizes N does
and does not divide, fewer elements than ranks, empty, 2-D — and brings back our result
next to torch's; the tests below compare them, check the bytes each rank sent against
the formulas the page teaches, and check that misuse raises the same one-line error on
every rank. Two more launches: a rank that never shows up, and the benchmark's smoke run.
"""

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from helpers import assert_timing
from tinyscale.comm import collectives as C
from tinyscale.comm.choose_allreduce import choose
from tinyscale.comm.counter import CollectiveCounter
from tinyscale.comm.launch import RankFailed, run_on_ranks
from tinyscale.comm.tree_allreduce import tree_all_reduce
from tinyscale.core.errors import UsageError

ROOT = Path(__file__).resolve().parents[3]
RECORDED = ROOT / "docs" / "generated" / "week1"
WORLD_SIZES = (2, 3, 4)
SHAPES = [(0,), (1,), (2,), (7,), (12,), (1000,), (1001,), (4, 5), (3, 7)]
KINDS = ("whole", "random", "int64")
REDUCTIONS = {"ring_all_reduce", "average", "tree_all_reduce", "ring_reduce_scatter"}
REDUCTIONS |= {"reduce_scatter_single", "reduce_scatter_uneven"}
# Random float32 sums: we add in ring order (or up the tree), gloo in its own order. With
# at most 4 summands of size ~1 each result carries a few float32 roundings of partial
# sums below ~10, i.e. under 1e-6 each; 1e-5 leaves room and still catches a lost summand.
RTOL, ATOL = 1e-5, 1e-5
CHECK_BYTES = C.META * 8  # one row of int64 metadata per ring step of the shape check


def make(shape: tuple[int, ...], kind: str, rank: int) -> torch.Tensor:
    """Rank ``rank``'s input: any rank can rebuild any other rank's, to compute expectations."""
    n = torch.Size(shape).numel()
    if kind == "random":
        gen = torch.Generator().manual_seed(1000 * rank + n)
        return torch.randn(shape, generator=gen)
    whole = (torch.arange(n).view(shape) * (rank + 1) - 3 * rank).float()  # exact sums
    return whole.long() if kind == "int64" else whole


def check_everything() -> dict[str, Any]:
    """On every rank: each collective, ours and torch's, on every shape and kind."""
    rank, world = dist.get_rank(), dist.get_world_size()
    pairs: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # (name, shape, kind) -> both
    traffic: dict[tuple, float] = {}  # (name, shape) -> bytes this rank sent, check included

    def run(name: str, shape: tuple[int, ...], kind: str, fn: Any, *args: Any) -> None:
        with CollectiveCounter() as counter:
            fn(*args)
        if kind == "whole":
            traffic[name, shape] = counter.sent_bytes()

    for shape in SHAPES:
        for kind in KINDS:
            x = make(shape, kind, rank)
            run("check", shape, kind, C.check_same, "check", x)  # the shape check alone
            ref = x.clone()
            dist.all_reduce(ref)
            ours = x.clone()
            run("ring_all_reduce", shape, kind, C.ring_all_reduce, ours)
            pairs["ring_all_reduce", shape, kind] = ours, ref
            pairs["tree_all_reduce", shape, kind] = tree_all_reduce(x.clone()), ref
            if kind != "int64":
                mean = C.ring_all_reduce(x.clone(), average=True)
                pairs["average", shape, kind] = mean, ref / world  # sum, then one division
            ours = x.clone()
            run("ring_reduce_scatter", shape, kind, C.ring_reduce_scatter, ours)
            mine = ours.view(-1).tensor_split(world)[rank]
            pairs["ring_reduce_scatter", shape, kind] = mine, ref.view(-1).tensor_split(world)[rank]
            ours = x.clone()
            run("ring_all_gather", shape, kind, C.ring_all_gather, ours)
            parts = [make(shape, kind, r).view(-1).tensor_split(world)[r] for r in range(world)]
            pairs["ring_all_gather", shape, kind] = ours, torch.cat(parts).view(shape)
            for src in range(world):
                ours, theirs = x.clone(), x.clone()
                run(f"broadcast from {src}", shape, kind, C.broadcast, ours, src)
                dist.broadcast(theirs, src)
                pairs[f"broadcast from {src}", shape, kind] = ours, theirs
            cat_shape = (world * shape[0], *shape[1:])  # N inputs concatenated along dim 0
            ours, theirs = x.new_empty(cat_shape), x.new_empty(cat_shape)
            run("all_gather_single", shape, kind, C.all_gather_single, ours, x)
            dist.all_gather_single(theirs, x)
            pairs["all_gather_single", shape, kind] = ours, theirs
            ours = [torch.empty_like(x) for _ in range(world)]
            theirs = [torch.empty_like(x) for _ in range(world)]
            C.all_gather(ours, x)
            dist.all_gather(theirs, x)
            pairs["all_gather", shape, kind] = torch.stack(ours), torch.stack(theirs)
            stacked = make(cat_shape, kind, rank)  # torch's form: N divides the input
            ours, theirs = x.new_empty(shape), x.new_empty(shape)
            run("reduce_scatter_single", shape, kind, C.reduce_scatter_single, ours, stacked)
            dist.reduce_scatter_single(theirs, stacked)
            pairs["reduce_scatter_single", shape, kind] = ours, theirs
            ours = x.new_empty(ref.view(-1).tensor_split(world)[rank].shape)
            C.reduce_scatter_single(ours, x)  # uneven: beyond torch, against the all-reduce
            pairs["reduce_scatter_uneven", shape, kind] = (
                ours,
                ref.view(-1).tensor_split(world)[rank],
            )
    return {"pairs": pairs, "traffic": traffic, "misuse": misuse()}


def misuse() -> dict[str, Any]:
    """Each bad call, made on every rank (only some ranks' arguments are bad)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    last = world - 1
    mine = len(torch.empty(6).tensor_split(world)[rank])  # this rank's chunk of 6 elements
    bad = {
        "shape": lambda t: C.ring_all_reduce(t),
        "dtype": lambda t: C.ring_all_reduce(t.double() if rank == last else t),
        "2-D, same numel": lambda t: C.broadcast(t.view(2, 3) if rank else t.view(3, 2), 0),
        "src": lambda t: C.broadcast(t, src=rank % 2),
        "src out of range": lambda t: C.broadcast(t, src=world),
        "output size": lambda t: C.reduce_scatter_single(torch.empty(mine + (rank == 0)), t),
        "not contiguous": lambda t: C.ring_all_reduce(t.view(2, 3).t() if rank == 0 else t),
        "average of ints": lambda t: C.ring_all_reduce(t.long(), average=True),
        "list too short": lambda t: C.all_gather([torch.empty(6)] * last, t),
        "tree, shape": lambda t: tree_all_reduce(t),
    }
    report: dict[str, Any] = {}
    for name, call in bad.items():
        numel = 6 + (rank == last and name in ("shape", "tree, shape"))
        t = torch.arange(float(numel))
        try:
            call(t)
            report[name] = None
        except UsageError as err:
            report[name] = str(err)
        report[name, "untouched"] = torch.equal(t, torch.arange(float(numel)))
    report["after"] = C.ring_all_reduce(torch.ones(5))  # the ring is still in step
    return report


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=lambda n: f"world{n}")
def results(request: pytest.FixtureRequest) -> tuple[int, list[dict[str, Any]]]:
    world = request.param
    return world, run_on_ranks(check_everything, world, timeout_s=30, deadline_s=240)


def test_every_collective_matches_torch(results) -> None:
    world, ranks = results
    for rank, result in enumerate(ranks):
        # 8 collectives + one broadcast per src, per kind; the average for the float kinds
        assert len(result["pairs"]) == len(SHAPES) * (len(KINDS) * (8 + world) + 2)
        for (name, shape, kind), (ours, theirs) in result["pairs"].items():
            where = f"{name} {shape} {kind} on rank {rank} of {world}"
            assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, where
            if kind == "random" and name in REDUCTIONS:
                torch.testing.assert_close(ours, theirs, rtol=RTOL, atol=ATOL, msg=where)
            else:  # copies, or sums of whole numbers: exact in any order
                assert torch.equal(ours, theirs), where


def test_random_sums_are_bit_identical_on_every_rank(results) -> None:
    """The all-gather copies finished chunks, so replicas cannot drift apart (DDP needs it)."""
    _, ranks = results
    for shape in SHAPES:
        first = ranks[0]["pairs"]["ring_all_reduce", shape, "random"][0]
        for result in ranks[1:]:
            assert torch.equal(result["pairs"]["ring_all_reduce", shape, "random"][0], first)


def chunk_bytes(shape: tuple[int, ...], world: int) -> list[int]:
    """Bytes of each tensor_split chunk of a float32 tensor of this shape."""
    return [4 * len(c) for c in torch.empty(shape).view(-1).tensor_split(world)]


def data_bytes(ranks: list[dict], name: str, shape: tuple[int, ...]) -> list[float]:
    """Each rank's bytes for one call, less its shape check's (counted alone, same shape)."""
    return [r["traffic"][name, shape] - r["traffic"]["check", shape] for r in ranks]


def test_ring_all_reduce_sends_2_n_minus_1_over_n_bytes(results) -> None:
    world, ranks = results
    for shape in SHAPES:
        size, chunks = 4 * torch.Size(shape).numel(), chunk_bytes(shape, world)
        sent = data_bytes(ranks, "ring_all_reduce", shape)
        # exact, any size: rank r sends every chunk but its own, then every chunk but r + 1
        assert sent == [2 * size - chunks[r] - chunks[(r + 1) % world] for r in range(world)]
        assert sum(sent) == 2 * (world - 1) * size
        if size % (4 * world) == 0:  # the page's formula, exact when N divides the size
            assert sent == [2 * (world - 1) / world * size] * world, shape
        checks = [r["traffic"]["check", shape] for r in ranks]
        assert checks == [(world - 1) * CHECK_BYTES] * world


def test_the_other_collectives_send_what_their_docstrings_say(results) -> None:
    world, ranks = results
    for shape in SHAPES:
        size, chunks = 4 * torch.Size(shape).numel(), chunk_bytes(shape, world)
        names = {name for name, s in ranks[0]["traffic"] if s == shape and name != "check"}
        sent = {name: data_bytes(ranks, name, shape) for name in names}
        assert sent["ring_reduce_scatter"] == [size - chunks[r] for r in range(world)]
        assert sent["ring_all_gather"] == [size - chunks[(r + 1) % world] for r in range(world)]
        assert sent["all_gather_single"] == [(world - 1) * size] * world
        stacked = chunk_bytes((world * shape[0], *shape[1:]), world)  # all equal
        assert sent["reduce_scatter_single"] == [world * size - stacked[r] for r in range(world)]
        for src in range(world):
            by_rank = sent[f"broadcast from {src}"]
            assert sum(by_rank) == (world - 1) * size
            assert by_rank[src] == (world - 1).bit_length() * size  # the root: ⌈log₂ N⌉ · S


def test_misuse_raises_the_same_one_line_error_on_every_rank(results) -> None:
    world, ranks = results
    reports = [r["misuse"] for r in ranks]
    names = [k for k in reports[0] if isinstance(k, str) and k != "after"]
    assert len(names) == 10
    for name in names:
        messages = [rep[name] for rep in reports]
        assert all(m is not None for m in messages), f"{name}: some rank did not raise"
        assert all("\n" not in m for m in messages), name
        assert all(rep[name, "untouched"] for rep in reports), f"{name}: a tensor changed"
    for rep in reports:  # and afterwards the ring still works
        assert torch.equal(rep["after"], torch.full((5,), float(world)))
    last = world - 1
    for name in ("shape", "dtype", "2-D, same numel", "src", "tree, shape"):
        assert len({rep[name] for rep in reports}) == 1, f"{name}: ranks disagree on the message"
    assert reports[0]["shape"] == (
        f"ring_all_reduce: ranks passed different tensors (rank 0: float32[6], rank {last}: "
        "float32[7]); pass the same shape and dtype"
    )
    assert f"rank {last}: float64[6]" in reports[0]["dtype"]
    assert (
        "rank 0: float32[3, 2] src=0, rank 1: float32[2, 3] src=0" in reports[0]["2-D, same numel"]
    )
    assert "rank 1: float32[6] src=1" in reports[0]["src"]
    assert reports[0]["src"].endswith("pass the same shape, dtype and src")
    assert reports[0]["tree, shape"].startswith("tree_all_reduce: ranks passed different")
    assert all(
        f"src={world} is no rank; use 0 to {last}" in rep["src out of range"] for rep in reports
    )
    assert all(
        rep["average of ints"].endswith("needs a floating-point tensor; convert it first")
        for rep in reports
    )
    assert all("empty_like" in rep["list too short"] for rep in reports)
    # A problem found on one rank: that rank says what, the others say who.
    assert reports[0]["not contiguous"].endswith(
        "pass tensor.contiguous() and copy the result back"
    )
    size0 = len(torch.empty(6).tensor_split(world)[0])
    assert reports[0]["output size"] == (
        f"reduce_scatter_single: output must be a torch.float32 tensor of {size0} elements "
        "on rank 0"
    )
    for rep in reports[1:]:
        assert rep["not contiguous"].endswith(
            "rank 0 passed bad arguments; fix them (see its error)"
        )
        assert rep["output size"].endswith("rank 0 passed bad arguments; fix them (see its error)")


def skip_the_collective() -> None:
    if dist.get_rank() == 1:
        time.sleep(10)  # alive, but never calls the all-reduce rank 0 waits in
    else:
        C.ring_all_reduce(torch.ones(4))


def test_a_rank_that_never_comes_fails_by_timeout_not_a_hang() -> None:
    start = time.monotonic()
    with pytest.raises(RankFailed, match=r"rank 0 of 2 raised:(.|\n)*Timed out waiting 2000ms"):
        run_on_ranks(skip_the_collective, 2, timeout_s=2.0, deadline_s=30)
    assert time.monotonic() - start < 25


def check_row(row: dict[str, Any], world_size: int) -> None:
    """The derived columns of one benchmark row follow from its size and times."""
    factor = 2 * (world_size - 1) / world_size
    for impl in ("ring", "pipelined", "doubling", "all_reduce", "gloo"):
        assert row[f"{impl}_s"] > 0
        assert row[f"{impl}_algbw"] == pytest.approx(row["bytes"] / row[f"{impl}_s"])
        assert row[f"{impl}_busbw"] == pytest.approx(row[f"{impl}_algbw"] * factor)
        if impl != "gloo":  # the median of the rounds' ratios lies within their quartiles
            low, high = row[f"{impl}_ratio_iqr"]
            assert low <= row[f"{impl}_ratio"] <= high
    assert row["picks"] == choose(row["bytes"], world_size)


def test_the_benchmark_measures_every_all_reduce_and_reports_bus_bandwidth() -> None:
    """A cheap point of the recorded table (4 KiB, 64 KiB; one round), compared with it.

    The recorded file is tools/figures_week1_collectives.py's run.
    Tolerance on the times: helpers.TIMING_FACTORS["microseconds"].
    """
    path = ROOT / "benchmarks" / "bench_collectives.py"
    spec = importlib.util.spec_from_file_location("bench_collectives", path)
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.measure(world_size=2, sizes=[4096, 65536], rounds=1, min_iters=2)
    assert [row["bytes"] for row in rows] == [4096, 65536]
    recorded_rows = json.loads((RECORDED / "collectives_busbw.json").read_text())
    recorded = {row["bytes"]: row for row in recorded_rows}
    for row in rows:
        check_row(row, world_size=2)
        for impl in ("ring", "doubling", "gloo"):
            was = recorded[row["bytes"]][f"{impl}_s"]
            what = f"collectives {impl} {row['bytes']} B"
            assert_timing(row[f"{impl}_s"], was, "microseconds", what)
    for row in recorded_rows:  # the recorded table: its columns agree, and the page's file
        check_row(row, world_size=row["world_size"])
    table = bench.format_table(recorded_rows, world_size=2) + "\n"
    assert (RECORDED / "collectives_busbw.md").read_text() == table
