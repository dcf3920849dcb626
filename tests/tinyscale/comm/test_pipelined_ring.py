"""tinyscale.comm.pipelined_ring against dist.all_reduce and the plain ring (gloo).

One launch per world size (2, 3, 4) runs the pipelined ring on every shape — sizes N does
and does not divide, fewer elements than ranks, empty, 2-D — at several segment sizes
(segments of one element, uneven segments, a chunk in one segment), on whole numbers,
random floats, ints, fp16 and bf16, and brings back the results next to torch's and the
plain ring's; also the bytes and the messages each rank sent, the order in which messages
were posted and waited for, and what misuse raises. The benchmark's segment sweep is
re-run at one cheap point against its recorded table.
"""

import functools
import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from helpers import CallTimeline, assert_timing, usage_error
from tinyscale.comm import collectives as C
from tinyscale.comm import pipelined_ring as P
from tinyscale.comm.counter import CollectiveCounter
from tinyscale.comm.launch import run_on_ranks

ROOT = Path(__file__).resolve().parents[3]
RECORDED = ROOT / "docs" / "generated" / "week1"
WORLD_SIZES = (2, 3, 4)
SHAPES = [(0,), (1,), (2,), (7,), (12,), (1000,), (1001,), (4, 5), (3, 7)]
# Segment sizes in bytes: below one element (empty segments), uneven ones, a whole chunk.
SMALL_SEGMENTS, LARGE_SEGMENTS = (1, 8, 36), (100, 1024, P.SEGMENT_BYTES)
KINDS = ("whole", "random", "int64", "int32", "float16", "bfloat16")
RTOL, ATOL = 1e-5, 1e-5  # random float32 sums in ring order against gloo's (see test_collectives)
CHECK_BYTES = C.META * 8
COUNTED = 1080  # float32 elements: chunks of 540, 360, 270, each cut evenly in 2 or 3


def make(shape: tuple[int, ...], kind: str, rank: int) -> torch.Tensor:
    """Rank ``rank``'s input. Whole numbers whose sums stay below 2^8: exact even in bf16."""
    n = torch.Size(shape).numel()
    if kind == "random":
        return torch.randn(shape, generator=torch.Generator().manual_seed(1000 * rank + n))
    whole = ((torch.arange(n).view(shape) % 16) * (rank + 1) - 3 * rank).float()
    return whole.to(getattr(torch, kind)) if kind != "whole" else whole


def traced(tensor: torch.Tensor, segment_bytes: int) -> tuple[list[str], int]:
    """Run the pipelined ring on a CallTimeline: each message's post and wait, in order
    ("post send0", "post recv0", "wait recv0", ...), and how many messages it sent."""
    with CallTimeline() as timeline:
        P.pipelined_ring_all_reduce(tensor, segment_bytes=segment_bytes, check=False)
    names: list[str] = []
    for call in timeline.calls:  # isend, irecv -> send0, send1, ..., recv0, ...
        kind = call.op.removeprefix("i")
        names.append(f"{kind}{sum(n.startswith(kind) for n in names)}")
    log = [f"{'post' if what == 'call' else what} {names[i]}" for what, i in timeline.events]
    return log, timeline.ops()["isend"]


def check_everything() -> dict[str, Any]:
    """On every rank: the pipelined ring, torch's all-reduce and the plain ring, everywhere."""
    rank, world = dist.get_rank(), dist.get_world_size()
    pairs: dict[tuple, tuple[torch.Tensor, ...]] = {}  # (shape, kind, segment) -> results
    traffic: dict[tuple, float] = {}  # (shape, kind, segment) -> bytes sent, check included
    for shape in SHAPES:
        for kind in KINDS:
            x = make(shape, kind, rank)
            ref = x.clone()
            dist.all_reduce(ref)
            plain = C.ring_all_reduce(x.clone())
            with CollectiveCounter() as check:  # the shape check alone
                C.check_same("check", x)
            traffic[shape, kind, "check"] = check.sent_bytes()
            for segment in SMALL_SEGMENTS if x.numel() < 100 else LARGE_SEGMENTS:
                with CollectiveCounter() as counter:
                    ours = P.pipelined_ring_all_reduce(x.clone(), segment_bytes=segment)
                pairs[shape, kind, segment] = ours, ref, plain
                traffic[shape, kind, segment] = counter.sent_bytes()
                if x.is_floating_point():
                    mean = P.pipelined_ring_all_reduce(
                        x.clone(), segment_bytes=segment, average=True
                    )
                    pairs[shape, kind, segment, "mean"] = mean, ref / world, plain / world
                    pairs[shape, kind, segment, "ring mean"] = (
                        mean,
                        C.ring_all_reduce(x.clone(), average=True),
                    )
    messages = {}
    for segment in (8, 4 * COUNTED // world // 3, 4 * COUNTED // world, P.SEGMENT_BYTES):
        messages[segment] = traced(torch.ones(COUNTED), segment)
    return {"pairs": pairs, "traffic": traffic, "messages": messages, "misuse": misuse()}


def misuse() -> dict[str, Any]:
    """Each bad call, made on every rank (for some, only rank 0's arguments are bad)."""
    rank = dist.get_rank()
    bad = {
        "zero": lambda t: P.pipelined_ring_all_reduce(t, segment_bytes=0),
        "negative": lambda t: P.pipelined_ring_all_reduce(t, segment_bytes=-4),
        "float": lambda t: P.pipelined_ring_all_reduce(t, segment_bytes=1.5),
        "rank 0 only": lambda t: P.pipelined_ring_all_reduce(
            t, segment_bytes=0 if rank == 0 else 8
        ),
        "unchecked": lambda t: P.pipelined_ring_all_reduce(t, segment_bytes=0, check=False),
        "average of ints": lambda t: P.pipelined_ring_all_reduce(t.long(), average=True),
        "shape": lambda t: P.pipelined_ring_all_reduce(t if rank else t[:5]),
    }
    report: dict[str, Any] = {}
    for name, call in bad.items():
        t = torch.arange(6.0)
        report[name] = usage_error(functools.partial(call, t))
        report[name, "untouched"] = torch.equal(t, torch.arange(6.0))
    report["after"] = P.pipelined_ring_all_reduce(torch.ones(5), segment_bytes=4)
    return report


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=lambda n: f"world{n}")
def results(request: pytest.FixtureRequest) -> tuple[int, list[dict[str, Any]]]:
    world = request.param
    return world, run_on_ranks(check_everything, world, timeout_s=30, deadline_s=240)


def test_pipelined_ring_matches_torch_and_the_plain_ring(results) -> None:
    world, ranks = results
    for rank, result in enumerate(ranks):
        for key, (ours, theirs, *plain) in result["pairs"].items():
            kind = key[1]
            where = f"{key} on rank {rank} of {world}"
            assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, where
            for other in plain:  # the plain ring: the same additions in the same order
                assert torch.equal(ours, other), where
            if "ring mean" in key:
                continue
            exact = kind != "random" or (world == 2 and "mean" not in key)  # a + b == b + a
            if exact:
                assert torch.equal(ours, theirs), where
            else:
                torch.testing.assert_close(ours, theirs, rtol=RTOL, atol=ATOL, msg=where)


def test_every_rank_ends_with_the_same_bits(results) -> None:
    _, ranks = results
    for key in ranks[0]["pairs"]:
        assert all(torch.equal(r["pairs"][key][0], ranks[0]["pairs"][key][0]) for r in ranks), key


def test_segmenting_adds_no_bytes(results) -> None:
    """Exactly the plain ring's bytes: 2S − |chunk r| − |chunk r+1|, whatever the segment."""
    world, ranks = results
    for shape, kind, segment in ranks[0]["traffic"]:
        checks = [r["traffic"][shape, kind, "check"] for r in ranks]
        assert checks == [(world - 1) * CHECK_BYTES] * world
        if segment == "check":
            continue
        item = make(shape, kind, 0).element_size()
        size = item * torch.Size(shape).numel()
        chunks = [item * len(c) for c in torch.empty(shape).view(-1).tensor_split(world)]
        sent = [r["traffic"][shape, kind, segment] - r["traffic"][shape, kind, "check"]
                for r in ranks]  # fmt: skip
        assert sent == [2 * size - chunks[r] - chunks[(r + 1) % world] for r in range(world)]
        assert sum(sent) == 2 * (world - 1) * size


def test_messages_per_rank_are_n_minus_1_times_p_plus_1(results) -> None:
    """The page's count: (N − 1) · P segments in the reduce-scatter, N − 1 chunks after."""
    world, ranks = results
    for segment, expected_p in [
        (8, COUNTED // world // 2),  # 2 floats a segment
        (4 * COUNTED // world // 3, 3),
        (4 * COUNTED // world, 1),  # a chunk fits one segment: the plain ring's 2 (N − 1)
        (P.SEGMENT_BYTES, 1),
    ]:
        assert P.segments_per_chunk(COUNTED, world, 4, segment) == expected_p
        for result in ranks:
            _, sends = result["messages"][segment]
            assert sends == (world - 1) * (expected_p + 1), (segment, world)


def test_segment_k_plus_1_is_posted_before_segment_k_is_waited_for(results) -> None:
    """The pipeline: at most two segments in flight, the next posted before the wait."""
    world, ranks = results
    parts = COUNTED // world // 2
    for result in ranks:
        log, _ = result["messages"][8]
        for k in range((world - 1) * parts - 1):  # every reduce-scatter message but the last
            assert log.index(f"post recv{k + 1}") < log.index(f"wait recv{k}"), k
            assert log.index(f"post send{k + 1}") < log.index(f"wait recv{k}"), k
            if k + 2 < (world - 1) * parts:  # and no deeper: k + 2 waits for k's wait
                assert log.index(f"post recv{k + 2}") > log.index(f"wait recv{k}"), k
        log, _ = result["messages"][4 * COUNTED // world]  # P = 1: strictly in turn
        assert log.index("wait recv0") < log.index("post recv1")


def test_bad_segment_sizes_raise_one_line_on_every_rank(results) -> None:
    world, ranks = results
    reports = [r["misuse"] for r in ranks]
    for rep in reports:
        for name in ("zero", "negative", "float", "unchecked", "average of ints", "shape"):
            assert rep[name] is not None and "\n" not in rep[name], name
            assert rep[name, "untouched"], name
        assert rep["zero"].endswith(f"pass a positive int (e.g. {P.SEGMENT_BYTES})")
        assert rep["zero"].startswith("pipelined_ring_all_reduce: segment_bytes=0;")
        assert "segment_bytes=1.5" in rep["float"]
        assert rep["unchecked"].startswith("pipelined_ring_all_reduce: segment_bytes=0;")
        assert rep["average of ints"].endswith("needs a floating-point tensor; convert it first")
        assert "ranks passed different tensors" in rep["shape"]
        assert torch.equal(rep["after"], torch.full((5,), float(world)))
    assert "segment_bytes=0" in reports[0]["rank 0 only"]
    for rep in reports[1:]:  # the others hear of rank 0's mistake instead of hanging
        assert rep["rank 0 only"].endswith("rank 0 passed bad arguments; fix them (see its error)")


def test_the_optimal_segment_count_minimizes_the_page_model() -> None:
    """The page's model: T(P) = (N − 1) · P · α + C · γ / P + terms without P.

    Its minimum, P* = √(C γ / ((N − 1) α)), against a search over whole P.
    """
    for world, alpha, gamma, chunk in [(2, 300e-6, 0.27e-9, 2**25), (4, 20e-6, 0.1e-9, 2**24)]:
        model = [(world - 1) * p * alpha + chunk * gamma / p for p in range(1, 10_000)]
        best = 1 + model.index(min(model))
        closed = math.sqrt(chunk * gamma / ((world - 1) * alpha))
        assert best in (math.floor(closed), math.ceil(closed))


def load_bench() -> Any:
    path = ROOT / "benchmarks" / "bench_collectives.py"
    spec = importlib.util.spec_from_file_location("bench_collectives", path)
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_segment_sweep_reruns_a_cheap_point_of_its_recorded_table() -> None:
    """tools/figures_week1_collectives.py's sweep, re-run at 4 MiB, two segments, one round."""
    bench = load_bench()
    size, segments = 4 * 2**20, [2**20, 2**22]
    rows = bench.sweep(world_size=2, sizes=[size], segments=segments, rounds=1, min_iters=1)
    recorded_rows = json.loads((RECORDED / "collectives_sweep.json").read_text())
    recorded = {(row["bytes"], row["segment_bytes"]): row for row in recorded_rows}
    assert [row["segment_bytes"] for row in rows] == segments
    for row in rows + recorded_rows:
        assert row["pipelined_busbw"] == pytest.approx(row["bytes"] / row["pipelined_s"])
        low, high = row["pipelined_ratio_iqr"]  # the median of the rounds' ratios, within
        assert low <= row["pipelined_ratio"] <= high  # their quartiles
    for row in rows:
        was = recorded[size, row["segment_bytes"]]["pipelined_s"]
        what = f"pipelined ring {row['bytes']} B"
        assert_timing(row["pipelined_s"], was, "microseconds", what)
    table = bench.format_sweep(recorded_rows, world_size=2) + "\n"
    assert (RECORDED / "collectives_sweep.md").read_text() == table
