"""ZeRO-3 with prefetching (tinyscale.data_parallel.zero_prefetch) against Week 2's stage 3.

One launch of 2 ranks trains both from the same init, with micro-batches, and returns
facts: prefetching must change when bytes move, never what arrives (bit-identical
weights, the same bytes sent), and cost exactly the units it gathers early.
"""

import pytest
import torch
import torch.distributed as dist

from helpers import CallTimeline
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.config import preset
from tinyscale.core.errors import UsageError
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel.ddp import random_batch
from tinyscale.data_parallel.zero import ZeRO
from tinyscale.data_parallel.zero_prefetch import PrefetchZeRO3

CFG = preset("tiny")
STEPS, MICRO = 3, 2


def train(prefetch: int | None, reduce_scatter: str = "ring") -> dict:
    """Stage 3 (prefetch None) or the prefetching one: 3 steps of 2 micro-batches each."""
    torch.manual_seed(0)
    model = TinyTransformer(CFG)
    units = list(model.blocks)
    if prefetch is None:
        zero = ZeRO(model, stage=3, units=units)
    else:
        zero = PrefetchZeRO3(model, units=units, prefetch=prefetch, reduce_scatter=reduce_scatter)
    async_gathers, sent = [], []
    for step in range(STEPS):
        with CallTimeline() as counter:  # torch's functions, counted from outside the class
            for micro in range(MICRO):
                seed = 100 * dist.get_rank() + micro
                batch = random_batch(CFG, batch_size=2, seq_len=16, step=step, seed=seed)
                zero(*batch)[1].backward()
            zero.step()
        zero.zero_grad()
        sent.append(counter.sent_bytes())
        calls = zip(counter.calls, counter.async_op, strict=True)
        async_gathers.append(sum(a for call, a in calls if call.op == "all_gather_single"))
    names = [u.name for u in getattr(zero, "plan", [])]
    left = in_flight(zero)  # the next step's first gathers, started by step()
    if prefetch is not None:
        zero.close()  # waits for them and drops their handles
    return {
        "left after the last step": left,
        "left after close": in_flight(zero),
        "weights": zero.full_parameters(),
        "peak": zero.peak_state_bytes,
        "sent": sent,
        "async_gathers": async_gathers,
        "plan": names,
        "block_bytes": zero.units[0].flat.numel() * 4,
        "root_bytes": zero.units[-1].flat.numel() * 4,
        "in_flight": in_flight(zero),
    }


def in_flight(zero: ZeRO) -> int:
    """Work handles the wrapper still holds: gathers and reduce-scatters in flight."""
    return len(getattr(zero, "gathering", {})) + len(getattr(zero, "reducing", []))


VARIANTS = {"stage3": (None,), "p0": (0,), "p1": (1,), "p2": (2,), "p1async": (1, "async")}


def facts() -> dict:
    return {name: train(*args) for name, args in VARIANTS.items()}


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_on_ranks(facts, 2, deadline_s=240)


@pytest.mark.parametrize("name", ["p0", "p1", "p2", "p1async"])
def test_same_weights_bit_for_bit(ranks, name) -> None:
    for r in ranks:
        assert torch.equal(r[name]["weights"], r["stage3"]["weights"])
    assert torch.equal(ranks[0][name]["weights"], ranks[1][name]["weights"])


PREFETCH = {"p0": 0, "p1": 1, "p2": 2, "p1async": 1}


@pytest.mark.parametrize("name", ["p0", "p1", "p2", "p1async"])
def test_bytes_sent_are_stage_3s_less_the_roots_second_gather(ranks, name) -> None:
    # Prefetching moves no extra byte, it moves bytes earlier: the first step also sends
    # the next step's first gathers (root, then block 0), started after the optimizer
    # step. Once the order is known, the root stays gathered from the end of forward to
    # the start of backward: one all-gather of it fewer per micro-batch. All-gathers
    # send (N - 1) / N of a unit's bytes, half at N = 2.
    for r in ranks:
        units = [r[name]["root_bytes"], r[name]["block_bytes"]][: PREFETCH[name]]
        first, *later = r[name]["sent"]
        assert first == r["stage3"]["sent"][0] + sum(units) // 2
        saved = MICRO * r[name]["root_bytes"] // 2
        assert later == [sent - saved for sent in r["stage3"]["sent"][1:]]


def test_the_recorded_order_is_forward_then_backward_per_micro_batch(ranks) -> None:
    forward = ["TinyTransformer", "Block", "Block"]
    backward = ["TinyTransformer", "Block", "Block"]
    assert ranks[0]["p1"]["plan"] == (forward + backward) * MICRO


def test_prefetch_starts_after_the_first_step_and_leaves_nothing_in_flight(ranks) -> None:
    for r in ranks:
        assert r["stage3"]["async_gathers"] == [0] * STEPS
        assert r["p0"]["async_gathers"] == [0] * STEPS
        first, *later = r["p1"]["async_gathers"]
        assert first == 1  # no order yet: only the next step's first unit, after step()
        assert all(n > 1 for n in later)
        assert r["p1"]["in_flight"] == r["p2"]["in_flight"] == r["p1async"]["in_flight"] == 0


def test_close_waits_for_what_is_in_flight_and_drops_it(ranks) -> None:
    for r in ranks:
        assert r["p1"]["left after the last step"] == 1  # the root's gather, for a next step
        assert r["p2"]["left after the last step"] == 2
        assert all(r[name]["left after close"] == 0 for name in PREFETCH)


def dropped_when_collected() -> tuple[int, int]:
    """A prefetching wrapper dropped with a gather in flight: its handles go with it."""
    import gc

    zero = PrefetchZeRO3(TinyTransformer(CFG), prefetch=1)
    zero(*random_batch(CFG, batch_size=2, seq_len=16, step=0, seed=0))[1].backward()
    zero.step()
    gathering = zero.gathering
    held = len(gathering)
    del zero
    gc.collect()
    return held, len(gathering)


def test_a_collected_wrapper_waits_for_its_gathers_and_drops_them() -> None:
    assert run_on_ranks(dropped_when_collected, 2, deadline_s=120) == [(1, 0), (1, 0)]


def test_extra_peak_is_the_prefetched_unit(ranks) -> None:
    for r in ranks:
        assert r["p0"]["peak"] == r["stage3"]["peak"]  # the ring waits, as Week 2 does
        assert r["p1"]["peak"] - r["p0"]["peak"] == r["p1"]["block_bytes"]
        assert r["p2"]["peak"] >= r["p1"]["peak"]


def test_a_reduce_scatter_in_flight_costs_the_larger_unit_before(ranks) -> None:
    # The peak moment holds the previous unit's full gradients (on the wire) instead of the
    # current one's: the root's reduce-scatter of micro-batch 1 is still in flight when
    # the last block's gradients of micro-batch 2 arrive.
    for r in ranks:
        extra = r["p1async"]["peak"] - r["p1"]["peak"]
        assert extra == r["p1"]["root_bytes"] - r["p1"]["block_bytes"] > 0


@pytest.mark.parametrize("prefetch", [-1, 1.5, "1"])
def test_bad_prefetch_is_a_one_line_error(prefetch) -> None:
    with pytest.raises(UsageError, match="use 0 \\(off\\), 1 or 2 units ahead"):
        PrefetchZeRO3(TinyTransformer(CFG), prefetch=prefetch)


def test_an_unknown_reduce_scatter_is_a_one_line_error() -> None:
    with pytest.raises(UsageError, match="use 'ring' or 'async'"):
        PrefetchZeRO3(TinyTransformer(CFG), reduce_scatter="nccl")
