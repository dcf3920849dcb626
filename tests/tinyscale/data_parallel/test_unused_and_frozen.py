"""A parameter without a gradient and a frozen one (tinyscale.data_parallel.unused_and_frozen).

One launch of 2 ranks trains the two-branch model under every sharded wrapper of the
course, the ranks taking different layers at steps 1 and 2 and nobody taking ``b`` at
step 3, against one process on the whole batch. The pages that run the demo
(week-2/zero-from-scratch.md, week-4/zero3-any-optimizer.md) show what these runs give.
Then, on one process: every wrapper is garbage-collected once dropped, hooks and all.
"""

import gc
import re
import weakref

import pytest
import torch
from torch import nn

from helpers import TIMEOUTS, one_line_error, recorded_output
from tinyscale.comm.launch import run_on_ranks
from tinyscale.data_parallel.fully_sharded import FullyShardedModel
from tinyscale.data_parallel.sharded_optimizer import ShardedOptimizer
from tinyscale.data_parallel.unused_and_frozen import (
    BRANCHES,
    WRAPPERS,
    TwoBranches,
    demo,
    facts,
)
from tinyscale.data_parallel.zero import ZeRO
from tinyscale.data_parallel.zero_prefetch import PrefetchZeRO3

PAGES = {  # the page that runs each wrapper's row
    "week-2/zero-from-scratch.md": WRAPPERS[:5],
    "week-4/zero3-any-optimizer.md": ("FullyShardedModel",),
    "week-4/parallelism-2d-3d.md": ("ShardedOptimizer",),
}


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_on_ranks(facts, 2, **{**TIMEOUTS, "deadline_s": 240.0})


@pytest.mark.parametrize("name", WRAPPERS)
def test_every_wrapper_ends_exactly_where_one_process_ends(ranks, name) -> None:
    # N = 2: the ranks add two gradients, the same sum in either order, and / 2 is exact
    for rank in ranks:
        assert rank[name]["vs one process"] == 0.0, (name, rank[name])
        assert rank[name]["frozen kept"]


def test_the_schedule_really_leaves_parameters_without_a_gradient() -> None:
    rank0, rank1 = BRANCHES
    assert [set(a) != set(b) for a, b in zip(rank0, rank1, strict=True)] == [True, True, False]
    assert all("b" not in layers for layers in (rank0[2], rank1[2]))  # step 3: b unused


@pytest.mark.parametrize("page", PAGES)
def test_the_pages_show_these_runs(ranks, page) -> None:
    lines = recorded_output(page, "unused_and_frozen import demo")
    assert lines[:2] == [f"rank {r}, layers per step: {', '.join(BRANCHES[r])}" for r in (0, 1)]
    rows = {line.split("  ")[0]: line for line in lines[2:]}
    assert tuple(rows) == PAGES[page]
    for name, line in rows.items():
        shown = float(re.search(r"one process ([\d.e+-]+),", line)[1])
        assert shown == max(r[name]["vs one process"] for r in ranks)
        assert line.endswith("frozen bias unchanged: True")


def wrappers() -> dict[str, tuple[nn.Module, object]]:
    """Each wrapper of a fresh model, trained one step (ZeRO-3 prefetch: a gather in flight)."""
    out = {}
    for name in WRAPPERS:
        model = TwoBranches()
        units = [model.inp, model.branches]
        if name == "FullyShardedModel":
            wrapped = FullyShardedModel(model, units=units)
        elif name == "ShardedOptimizer":
            wrapped = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2)
        elif name.endswith("prefetch"):
            wrapped = PrefetchZeRO3(model, units=units, prefetch=1)
        else:
            wrapped = ZeRO(model, stage=int(name[-1]), units=units)
        call = wrapped if isinstance(wrapped, nn.Module) else model
        call(torch.ones(2, 4), "ab").sum().backward()
        if name == "FullyShardedModel":
            torch.optim.AdamW(wrapped.parameters(), lr=1e-2).step()
        else:
            wrapped.step()
        out[name] = weakref.ref(wrapped), weakref.ref(model)
    return out


def test_a_dropped_wrapper_is_collected_with_its_hooks(process_group_of_one) -> None:
    refs = wrappers()  # nothing else refers to the wrappers or their models
    gc.collect()
    alive = [name for name, (wrapped, model) in refs.items() if wrapped() or model()]
    assert alive == []


def test_an_unknown_wrapper_is_a_one_line_error() -> None:
    assert one_line_error(demo, "ZeRO-4").startswith("no wrapper 'ZeRO-4': name some of ZeRO-0")
