"""DDP from scratch, step 4 (tinyscale.data_parallel.ddp_views) against torch's DDP, on gloo.

One run_on_ranks launch per world size gathers the facts (world 4: parity only):

- parity: every ablation variant ends 5 SGD steps bit-identical to torch's DDP with
  gradient_as_bucket_view=True at N=2 (within PARITY_TOLERANCE at N=4), and so does
  no_sync accumulation with zero_grad(set_to_none=False);
- every .grad is a view into its bucket's buffer after a step, whichever zero_grad;
- the first bucket obeys its cap; one all-reduce per bucket, the first during backward;
- unused and frozen parameters; misuse is a one-line UsageError.
"""

import functools
import json
import math
from types import ModuleType

import pytest
import torch
import torch.distributed as dist
from ddp_helpers import branchy_case, step_events
from torch import nn

from helpers import ROOT, CallTimeline, load_tool, usage_error
from tinyscale.comm.comm_model import assign_buckets
from tinyscale.core.config import preset
from tinyscale.core.errors import UsageError
from tinyscale.core.memory import MiB
from tinyscale.core.model import TinyTransformer
from tinyscale.core.parity import flat_parameters, largest_difference
from tinyscale.data_parallel.ddp import random_batch
from tinyscale.data_parallel.ddp_buckets import PARITY_TOLERANCE, compare_with_torch_ddp
from tinyscale.data_parallel.ddp_views import (
    FIRST_BUCKET_MB,
    ViewDDP,
    ablation,
    torch_ddp_views,
)

CFG = preset("tiny")
CAP_MB, FIRST_MB = 0.02, 0.005  # the tiny model's 0.1 MB of gradients: 4 buckets, a small first


def in_buffer(grad: torch.Tensor, buffer: torch.Tensor) -> bool:
    """Is ``grad`` a view whose bytes lie inside ``buffer``'s?"""
    start, end = buffer.data_ptr(), buffer.data_ptr() + buffer.numel() * buffer.element_size()
    return grad._base is buffer and start <= grad.data_ptr() < end


def views_of_buckets(model: ViewDDP) -> bool:
    return all(
        p.grad is view and in_buffer(p.grad, b.buffer)
        for b in model.buckets
        for p, view in zip(b.params, b.views, strict=True)
    )


def train_with_no_sync(wrap, base: nn.Module, micro: list, steps: int = 3) -> dict:
    """Two micro-batches per step (the first under no_sync), zero_grad(set_to_none=False)."""
    model = wrap(copy_of(base), CAP_MB)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    finish = getattr(model, "finish_gradient_synchronization", lambda: None)
    with CallTimeline() as counter:
        for _ in range(steps):
            with model.no_sync():
                model(*micro[0])[1].backward()
            model(*micro[1])[1].backward()
            finish()
            opt.step()
            opt.zero_grad(set_to_none=False)
    return {
        "params": flat_parameters(model),
        "all_reduces": counter.ops()["all_reduce"],
        "model": model,
    }


def one_step(model: ViewDDP, batch) -> None:
    model(*batch)[1].backward()
    model.finish_gradient_synchronization()


def copy_of(module: nn.Module) -> nn.Module:
    clone = TinyTransformer(CFG)
    clone.load_state_dict(module.state_dict())
    return clone


def multi_rank_facts(full: bool) -> dict:
    """Everything that needs a process group, in one launch; returns facts to assert on."""
    rank = dist.get_rank()
    variants = {**ablation(first_bucket_mb=FIRST_MB), "torch DDP": torch_ddp_views}
    facts: dict = {
        "parity": compare_with_torch_ddp(cfg=CFG, bucket_cap_mb=CAP_MB, variants=variants)
    }
    if not full:
        return facts

    # no_sync accumulation and zero_grad(set_to_none=False), against torch's DDP
    torch.manual_seed(0)
    base = TinyTransformer(CFG)
    micro = [random_batch(CFG, batch_size=2, seq_len=8, step=s, seed=3 + rank) for s in (0, 1)]
    ours = train_with_no_sync(ablation(FIRST_MB)["views + first bucket + lean hooks"], base, micro)
    theirs = train_with_no_sync(torch_ddp_views, base, micro)
    model = ours["model"]
    facts["no_sync"] = {
        "diff": largest_difference(ours["params"], theirs["params"]),
        "all_reduces": ours["all_reduces"],
        "buckets": len(model.buckets),
        "views_after_set_to_none_false": views_of_buckets(model),
    }

    # set_to_none=True drops the views; the next backward's hooks adopt the fresh grads
    batch = random_batch(CFG, batch_size=2, seq_len=8, step=0, seed=1)
    model.zero_grad(set_to_none=True)
    dropped = all(p.grad is None for p in model.params)
    log = step_events(model, functools.partial(one_step, model, batch))
    facts["views"] = {
        "dropped": dropped,
        "views_after_set_to_none_true": views_of_buckets(model),
        "log": log,
        "bucket_numels": [b.buffer.numel() for b in model.buckets],
        "bucket_bytes": [b.nbytes for b in model.buckets],
        "tensor_bytes": [[p.numel() * p.element_size() for p in b.params] for b in model.buckets],
        "default_bytes": [b.nbytes for b in ViewDDP(TinyTransformer(preset("bench"))).buckets],
    }

    # frozen and unused parameters: zeros from the rank that skipped the branch
    branchy, x, expected = branchy_case(functools.partial(ViewDDP, bucket_cap_mb=CAP_MB))
    for _ in range(2):  # the second step: rank 1's view of rank0_only holds the old average
        branchy.zero_grad(set_to_none=True)
        branchy(x).backward()
        branchy.finish_gradient_synchronization()
    facts["branchy"] = {
        "frozen_grad_is_none": branchy.module.frozen.weight.grad is None,
        "rank0_only_grad": branchy.module.rank0_only.weight.grad.clone(),
        "expected": expected,
        "collectives": branchy.num_collectives,
        "buckets": len(branchy.buckets),
    }

    # misuse: one UsageError message per mistake
    model = ViewDDP(TinyTransformer(CFG), bucket_cap_mb=CAP_MB)
    facts["errors"] = {
        "finish before backward": usage_error(model.finish_gradient_synchronization),
        "forward twice": usage_error(lambda: (model(*batch)[1].backward(), model(*batch))),
    }
    model.finish_gradient_synchronization()  # the pending step completes: no hang at exit
    return facts


# --- parity with torch DDP -------------------------------------------------------------


def test_every_step_4_variant_is_bit_identical_to_torch_ddp_at_world_2(world2) -> None:
    for rank in world2:
        for name, r in rank["parity"].items():
            assert r["vs_torch"] == 0.0, name  # a + b is the same float in any order
            assert r["rank_spread"] == 0.0, name


def test_every_step_4_variant_matches_torch_ddp_at_world_4(world4) -> None:
    for rank in world4:
        for name, r in rank["parity"].items():
            assert r["vs_torch"] < PARITY_TOLERANCE, name
            assert r["rank_spread"] == 0.0, name


def test_no_sync_accumulates_into_the_views_like_torch_ddp(world2) -> None:
    for rank in world2:
        r = rank["no_sync"]
        assert r["diff"] == 0.0
        assert r["all_reduces"] == 3 * r["buckets"], "one all-reduce per bucket per step"


# --- gradients are views ---------------------------------------------------------------


def test_grads_are_views_into_the_bucket_buffers_whichever_zero_grad(world2) -> None:
    for rank in world2:
        assert rank["no_sync"]["views_after_set_to_none_false"]
        assert rank["views"]["dropped"], "zero_grad(set_to_none=True) drops them, as torch's"
        assert rank["views"]["views_after_set_to_none_true"], "the hooks adopt the new grads"


def test_one_all_reduce_per_whole_bucket_and_the_first_starts_during_backward(world2) -> None:
    r = world2[0]["views"]
    kinds = [kind for kind, _ in r["log"]]
    calls = [event for event in r["log"] if event[0] != "grad"]
    assert calls == [("all_reduce", numel) for numel in r["bucket_numels"]]
    first = kinds.index("all_reduce")
    assert "grad" in kinds[first:], "gradients still arrive after the first launch"


# --- the first bucket ------------------------------------------------------------------


def test_the_first_bucket_closes_at_its_own_cap(world2) -> None:
    r = world2[0]["views"]
    first, rest = r["tensor_bytes"][0], r["tensor_bytes"][1:]
    first_cap, cap = int(FIRST_MB * MiB), int(CAP_MB * MiB)
    assert sum(first[:-1]) < first_cap <= sum(first) < cap, "closed by its last tensor"
    assert all(sum(sizes) >= cap for sizes in rest[:-1]), "the others by the usual cap"


def test_default_first_bucket_is_torchs_one_mib_and_its_rule() -> None:
    assert FIRST_BUCKET_MB * MiB == dist._DEFAULT_FIRST_BUCKET_BYTES == MiB
    params = [p for p in TinyTransformer(preset("bench")).parameters()][::-1]
    caps = [dist._DEFAULT_FIRST_BUCKET_BYTES, 5 * MiB]
    torchs, _ = dist._compute_bucket_assignment_by_size(params, caps)
    ours = assign_buckets(
        [p.numel() * 4 for p in params], cap_bytes=caps[1], first_cap_bytes=caps[0]
    )
    assert ours == torchs


def test_bench_model_gets_a_1_mib_first_bucket_by_default(world2) -> None:
    first, *rest = world2[0]["views"]["default_bytes"]
    assert MiB <= first < 2 * MiB and len(rest) == 1, "25 MB cap: 1 MiB, then the rest"


# --- unused and frozen parameters, mistakes -------------------------------------------


def test_frozen_parameters_are_skipped_and_unused_ones_average_zeros(world2) -> None:
    b = [rank["branchy"] for rank in world2]
    expected = b[0]["expected"]
    assert expected.abs().sum() > 0
    for x in b:
        assert x["frozen_grad_is_none"]
        assert torch.allclose(x["rank0_only_grad"], expected, rtol=1e-6, atol=0)
        assert x["collectives"] == 2 * x["buckets"], "the same collectives on both ranks"


def test_misuse_is_a_one_line_usage_error(world2) -> None:
    errors = world2[0]["errors"]
    assert "call loss.backward()" in errors["finish before backward"]
    assert "call finish_gradient_synchronization()" in errors["forward twice"]
    assert all("\n" not in message for message in errors.values())


@pytest.mark.parametrize("mb", [0, -1.0, math.inf, math.nan, "1"])
def test_first_bucket_size_must_be_positive(mb) -> None:
    with pytest.raises(UsageError, match=r"^first_bucket_mb must be a positive number of MB"):
        ViewDDP(nn.Linear(2, 2), first_bucket_mb=mb)


# --- the benchmark's ablation (a smoke test: no timings are asserted) ------------------


def test_benchmark_runs_the_ablation_and_the_recorded_table_is_the_tools(
    bench_ddp: ModuleType,
) -> None:
    bench = bench_ddp
    rows = bench.rows(sweep=(25.0,), rounds=1, steps=1)
    kinds = [r["kind"] for r in rows]
    assert kinds[-4:] == ["torch default", *list(ablation())[1:]]
    assert all(r["tokens_per_s"] > 0 and len(r["ratio_quartiles"]) == 5 for r in rows)
    recorded_dir = ROOT / "docs" / "generated" / "week1"
    recorded = json.loads((recorded_dir / "ddp_bench.json").read_text())
    for r in recorded:
        low, q1, median, q3, high = r["ratio_quartiles"]
        assert low <= q1 <= median <= q3 <= high
    tool = load_tool("figures_week1_ddp")
    assert (recorded_dir / "ddp_ablation.md").read_text() == tool.ablation_table(bench, recorded)
