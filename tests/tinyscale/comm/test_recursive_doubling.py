"""tinyscale.comm.recursive_doubling and tinyscale.comm.choose_allreduce, against gloo and the ring.

One launch per world size — 2 and 4 (powers of two), 3 (one rank folded) and 6 (two) —
runs recursive doubling and the course's ``all_reduce`` on every shape and kind, next
to ``dist.all_reduce`` and our ring, and brings back the results, the bytes and steps
each rank sent (a CallTimeline), and what misuse raises. The tests compare them with
the page's formulas (``comm_model.recursive_doubling_steps``, ``recursive_doubling_bytes``,
``doubling_crossover_bytes``) and with the recorded link fit behind ``THIS_MACHINE``.
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
from tinyscale.comm import choose_allreduce as A
from tinyscale.comm import collectives as C
from tinyscale.comm import comm_model as M
from tinyscale.comm.launch import run_on_ranks
from tinyscale.comm.recursive_doubling import recursive_doubling_all_reduce

ROOT = Path(__file__).resolve().parents[3]
RECORDED = ROOT / "docs" / "generated" / "week1"
WORLD_SIZES = (2, 3, 4, 6)
SHAPES = [(0,), (1,), (2,), (7,), (1000,), (1001,), (4, 5)]
KINDS = ("whole", "random", "int64", "float16", "bfloat16")
# Random float32 sums in doubling order against gloo's ring order: at most 6 summands of
# size ~1, a few float32 roundings of partial sums below ~10 (each under 1e-6), as for the
# ring (test_collectives.RTOL); 1e-5 leaves room and still catches a lost summand.
RTOL, ATOL = 1e-5, 1e-5
COUNTED = 1000  # float32 elements whose messages are counted: S = 4000 bytes
# THIS_MACHINE was rounded from a recorded fit; a new recording (make figures) may move
# the fit by this factor, either way, before the constants must follow it.
FIT_DRIFT = 2.0
SMALL = A.Link(alpha_s=1e-7, bandwidth_bps=1e9)  # alpha B = 100 B: both algorithms in play


def make(shape: tuple[int, ...], kind: str, rank: int) -> torch.Tensor:
    """Rank ``rank``'s input. Whole numbers whose sums stay below 2^8: exact even in bf16."""
    n = torch.Size(shape).numel()
    if kind == "random":
        return torch.randn(shape, generator=torch.Generator().manual_seed(1000 * rank + n))
    whole = ((torch.arange(n).view(shape) % 8) * (rank + 1) - 3 * rank).float()
    return whole if kind == "whole" else whole.to(getattr(torch, kind))


def steps_of(timeline: CallTimeline) -> int:
    """Rounds on this rank: a round posts its messages, then waits for them; a post after
    a wait starts the next round."""
    kinds = [what for what, _ in timeline.events]
    return sum(
        1 for a, b in zip(["wait", *kinds], kinds, strict=False) if (a, b) == ("wait", "call")
    )


def check_everything() -> dict[str, Any]:
    """On every rank: doubling, all_reduce, the ring and gloo's on every shape and kind."""
    world = dist.get_world_size()
    pairs: dict[tuple, tuple[torch.Tensor, ...]] = {}  # key -> (ours, gloo's, the ring's)
    for shape in SHAPES:
        for kind in KINDS:
            x = make(shape, kind, dist.get_rank())
            ref, ring = x.clone(), C.ring_all_reduce(x.clone())
            dist.all_reduce(ref)
            pairs["doubling", shape, kind] = recursive_doubling_all_reduce(x.clone()), ref, ring
            for link in (A.THIS_MACHINE, SMALL):
                picked = A.choose(x.nbytes, world, link)
                pairs["all_reduce", picked, shape, kind] = A.all_reduce(x.clone(), link=link), ref
            if x.is_floating_point():
                mean = recursive_doubling_all_reduce(x.clone(), average=True)
                pairs["mean", shape, kind] = mean, ref / world, C.ring_all_reduce(x, average=True)
    with CallTimeline() as timeline:
        recursive_doubling_all_reduce(torch.ones(COUNTED), check=False)
    counted = {"sent": timeline.sent_bytes(), "sends": timeline.ops()["isend"]}
    return {"pairs": pairs, "counted": counted | {"steps": steps_of(timeline)}, "misuse": misuse()}


def misuse() -> dict[str, Any]:
    """Each bad call, made on every rank (the last rank's tensor is one element longer)."""
    last = dist.get_world_size() - 1
    bad = {
        "shape": recursive_doubling_all_reduce,
        "average of ints": lambda t: recursive_doubling_all_reduce(t.long(), average=True),
        "all_reduce, shape": A.all_reduce,
        "all_reduce, average of ints": lambda t: A.all_reduce(t.long(), average=True),
    }
    report: dict[str, Any] = {}
    for name, call in bad.items():
        numel = 6 + (dist.get_rank() == last and "shape" in name)
        t = torch.arange(float(numel))
        report[name] = usage_error(functools.partial(call, t))
        report[name, "untouched"] = torch.equal(t, torch.arange(float(numel)))
    report["after"] = recursive_doubling_all_reduce(torch.ones(5))  # still in step
    return report


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=lambda n: f"world{n}")
def results(request: pytest.FixtureRequest) -> tuple[int, list[dict[str, Any]]]:
    world = request.param
    return world, run_on_ranks(check_everything, world, timeout_s=30, deadline_s=240)


def test_doubling_matches_gloo_and_the_ring(results) -> None:
    """Bit for bit where sums are exact (whole numbers); within RTOL, ATOL for random floats."""
    world, ranks = results
    for rank, result in enumerate(ranks):
        for key, (ours, *others) in result["pairs"].items():
            where = f"{key} on rank {rank} of {world}"
            for other in others:
                assert ours.dtype == other.dtype and ours.shape == other.shape, where
                if "random" in key and world > 2:  # N = 2: a + b == b + a, exact
                    torch.testing.assert_close(ours, other, rtol=RTOL, atol=ATOL, msg=where)
                else:
                    assert torch.equal(ours, other), where


def test_every_rank_ends_with_the_same_bits(results) -> None:
    _, ranks = results
    for key in ranks[0]["pairs"]:
        assert all(torch.equal(r["pairs"][key][0], ranks[0]["pairs"][key][0]) for r in ranks), key


def test_all_reduce_ran_both_algorithms(results) -> None:
    world, ranks = results
    picked = {key[1] for key in ranks[0]["pairs"] if key[0] == "all_reduce"}
    both = {"recursive doubling", "pipelined ring"}
    assert picked == (both if world > 2 else {"recursive doubling"})  # N = 2: S* is infinite


def test_bytes_and_steps_are_the_formulas(results) -> None:
    """The busiest rank sends recursive_doubling_bytes; the longest chain of rounds is
    recursive_doubling_steps; over all ranks, each message carries all S bytes."""
    world, ranks = results
    size = 4 * COUNTED
    counted = [r["counted"] for r in ranks]
    busiest = max(c["sent"] for c in counted)
    assert busiest == M.recursive_doubling_bytes(size_bytes=size, world_size=world)
    assert max(c["steps"] for c in counted) == M.recursive_doubling_steps(world)
    assert all(c["sent"] == c["sends"] * size for c in counted)
    power = 2 ** int(math.log2(world))
    folded = world - power  # each sends once; its partner returns it the sum
    assert sum(c["sends"] for c in counted) == power * int(math.log2(power)) + 2 * folded


def test_misuse_raises_one_line_on_every_rank(results) -> None:
    world, ranks = results
    for rep in (r["misuse"] for r in ranks):
        for name in (
            "shape",
            "average of ints",
            "all_reduce, shape",
            "all_reduce, average of ints",
        ):
            assert rep[name] is not None and "\n" not in rep[name], name
            assert rep[name, "untouched"], name
        assert rep["shape"].startswith("recursive_doubling_all_reduce: ranks passed different")
        assert rep["all_reduce, shape"].startswith("all_reduce: ranks passed different tensors")
        assert rep["average of ints"].endswith("needs a floating-point tensor; convert it first")
        assert torch.equal(rep["after"], torch.full((5,), float(world)))


@pytest.mark.parametrize("world", [2, 3, 4, 5, 6, 8, 16, 64, 100])
def test_the_crossover_is_where_the_model_times_meet(world: int) -> None:
    link = {"alpha_s": 50e-6, "bandwidth_bps": 2e9}

    def time(steps: int, sent: float) -> float:
        return steps * link["alpha_s"] + sent / link["bandwidth_bps"]

    def doubling(s: float) -> float:
        return time(
            M.recursive_doubling_steps(world),
            M.recursive_doubling_bytes(size_bytes=s, world_size=world),
        )

    def ring(s: float) -> float:
        return time(
            M.ring_allreduce_steps(world), M.ring_allreduce_bytes(size_bytes=s, world_size=world)
        )

    crossover = M.doubling_crossover_bytes(world_size=world, **link)
    if world == 2:  # the same bytes, half the steps: doubling wins at every size
        assert crossover == math.inf and doubling(2**40) < ring(2**40)
        return
    assert doubling(crossover) == pytest.approx(ring(crossover), rel=1e-12)
    assert doubling(crossover / 2) < ring(crossover / 2) and doubling(2 * crossover) > ring(
        2 * crossover
    )
    for n in (world, 2 * world):  # the fold: two steps more, and one S more for the busiest
        assert M.recursive_doubling_steps(n) == math.floor(math.log2(n)) + 2 * (n & (n - 1) != 0)


def load_bench() -> Any:
    path = ROOT / "benchmarks" / "bench_collectives.py"
    spec = importlib.util.spec_from_file_location("bench_collectives", path)
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_link_fit_reruns_a_cheap_point_and_this_machine_is_the_recording() -> None:
    """tools/figures_week1_collectives.py's link fit: two sizes, one round, against the
    recording (helpers.TIMING_FACTORS["microseconds"]); THIS_MACHINE is the recorded fit
    within FIT_DRIFT; the recorded table is format_link of the recorded numbers."""
    bench = load_bench()
    recorded = json.loads((RECORDED / "allreduce_link.json").read_text())
    sizes = recorded["bytes"][:2]
    fresh = bench.measure_link(sizes=sizes, rounds=1)
    for size, seconds, was in zip(sizes, fresh["seconds"], recorded["seconds"], strict=False):
        assert_timing(seconds, was, "microseconds", f"one swap of {size} B")
    for field in ("alpha_s", "bandwidth_bps"):
        ratio = getattr(A.THIS_MACHINE, field) / recorded[field]
        assert 1 / FIT_DRIFT <= ratio <= FIT_DRIFT, (
            f"THIS_MACHINE.{field} is {ratio:.2f}x the recorded fit: set THIS_MACHINE = "
            f"Link(alpha_s={recorded['alpha_s']:.2g}, bandwidth_bps={recorded['bandwidth_bps']:.2g})"
        )
    assert (RECORDED / "allreduce_link.md").read_text() == bench.format_link(recorded) + "\n"
