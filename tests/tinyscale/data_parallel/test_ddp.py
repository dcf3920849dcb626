"""DDP from scratch (tinyscale.data_parallel.ddp, tinyscale.data_parallel.ddp_buckets) against torch's DDP, on gloo.

One run_on_ranks launch per world size (2 and 4) runs every multi-process check and
returns facts; the test functions assert on them:

- parity: NaiveDDP, BucketedDDP and OverlappedDDP end 5 SGD steps within PARITY_TOLERANCE
  of torch.nn.parallel.DistributedDataParallel, from per-rank random inits (so the
  broadcast at construction matters), and every rank is bit-identical after every step;
- collective counts, seen from outside the classes by a CollectiveCounter (one step's
  timeline, helpers.CallTimeline): naive = one per trainable tensor, bucketed and overlapped = one per bucket, and the buckets are those of torch's
  own assignment rule;
- overlap: the first bucket's all-reduce is launched while gradients are still arriving;
- frozen and unused parameters, no_sync accumulation, and misuse (UsageError).
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

from helpers import ROOT, CallTimeline, assert_timing, load_tool, usage_error
from tinyscale.core.config import preset
from tinyscale.core.errors import UsageError
from tinyscale.core.memory import MiB
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel.ddp import ForgetfulDDP, NaiveDDP, update_size_ratio
from tinyscale.data_parallel.ddp_buckets import (
    PARITY_TOLERANCE,
    BucketedDDP,
    OverlappedDDP,
    compare_with_torch_ddp,
)

CFG = preset("tiny")
CAP_MB = 0.01  # ~10 KB: the tiny model's 28 tensors (104 KB) fall into several buckets
# no_sync accumulation vs one backward over both micro-batches: the same sums, grouped
# differently in float32 (gradients of size ~1e-2, rounding ~1e-9).
ACCUMULATION_TOLERANCE = 1e-7


def one_step(model: nn.Module, batch) -> None:
    model(*batch)[1].backward()
    model.finish_gradient_synchronization()


def multi_rank_facts(full: bool) -> dict:
    """Everything that needs a process group, in one launch; returns facts to assert on."""
    rank = dist.get_rank()
    facts: dict = {"parity": compare_with_torch_ddp(cfg=CFG, bucket_cap_mb=CAP_MB)}

    # collective counts and the order of events, seen from outside the classes
    torch.manual_seed(rank)
    from tinyscale.data_parallel.ddp import random_batch

    batch = random_batch(CFG, batch_size=2, seq_len=8, step=0, seed=1)
    for name, wrap in {
        "naive": NaiveDDP,
        "bucketed": functools.partial(BucketedDDP, bucket_cap_mb=CAP_MB),
        "overlapped": functools.partial(OverlappedDDP, bucket_cap_mb=CAP_MB),
    }.items():
        model = wrap(TinyTransformer(CFG))
        facts[name] = {
            "log": step_events(model, functools.partial(one_step, model, batch)),
            "trainable": len(model.params),
            "buckets": [[id(p) for p in b.params] for b in getattr(model, "buckets", [])],
            "bucket_bytes": [b.nbytes for b in getattr(model, "buckets", [])],
            "order": [id(p) for p in model.params],
            "grad_is_average": None,
        }
    if not full:
        return facts

    # frozen and unused parameters
    model, x, expected_rank0 = branchy_case(functools.partial(OverlappedDDP, bucket_cap_mb=CAP_MB))
    model(x).backward()
    model.finish_gradient_synchronization()
    bucketed = {id(p) for b in model.buckets for p in b.params}
    facts["branchy"] = {
        "frozen_grad_is_none": model.module.frozen.weight.grad is None,
        "frozen_in_no_bucket": id(model.module.frozen.weight) not in bucketed,
        "frozen_weight": model.module.frozen.weight.detach().clone(),
        "rank0_only_grad": model.module.rank0_only.weight.grad.clone(),
        "expected_rank0_only_grad": expected_rank0,
        "collectives": model.num_collectives,
        "buckets": len(model.buckets),
    }
    # used in the first micro-batch (no_sync) only: its accumulated gradient must survive
    model.zero_grad(set_to_none=True)
    with model.no_sync():
        model(x).backward()
    model.module.extra = False
    model(x).backward()
    model.finish_gradient_synchronization()
    facts["branchy"]["accumulated_rank0_only_grad"] = model.module.rank0_only.weight.grad.clone()

    # no_sync: two micro-batches, one all-reduce per bucket, the same grads as one batch
    torch.manual_seed(0)
    base = TinyTransformer(CFG)
    micro = [random_batch(CFG, batch_size=2, seq_len=8, step=s, seed=2) for s in (0, 1)]
    ours = OverlappedDDP(TinyTransformer(CFG), bucket_cap_mb=CAP_MB)
    ours.module.load_state_dict(base.state_dict())
    with CallTimeline() as counter:
        with ours.no_sync():
            ours(*micro[0])[1].backward()
        ours(*micro[1])[1].backward()
        ours.finish_gradient_synchronization()
    reference = NaiveDDP(TinyTransformer(CFG))
    reference.module.load_state_dict(base.state_dict())
    for x, y in micro:
        reference(x, y)[1].backward()
    reference.finish_gradient_synchronization()
    facts["no_sync"] = {
        "all_reduces": counter.ops()["all_reduce"],
        "buckets": len(ours.buckets),
        "max_diff": max(
            (a.grad - b.grad).abs().max().item()
            for a, b in zip(ours.params, reference.params, strict=True)
        ),
    }

    # misuse: one UsageError message per mistake
    model = OverlappedDDP(TinyTransformer(CFG), bucket_cap_mb=CAP_MB)
    facts["errors"] = {
        "finish before backward": usage_error(model.finish_gradient_synchronization),
        "forward twice": usage_error(lambda: (model(*batch)[1].backward(), model(*batch))),
        "all frozen": usage_error(lambda: NaiveDDP(nn.Linear(2, 2).requires_grad_(False))),
    }
    model.finish_gradient_synchronization()  # the pending step completes: no hang at exit

    # the exercise: a DDP that forgets to divide by the world size
    facts["forgetful"] = {o: update_size_ratio(optimizer=o) for o in ("sgd", "adamw")}
    facts["forgetful_collectives"] = ForgetfulDDP(nn.Linear(2, 2)).num_collectives
    return facts


@pytest.fixture(params=[2, 4], ids=["world2", "world4"])
def facts(request) -> tuple[int, list[dict]]:
    """Both launches (conftest.py: world2 runs the extra checks too)."""
    return request.param, request.getfixturevalue(f"world{request.param}")


# --- parity with torch DDP -------------------------------------------------------------


def test_ours_matches_torch_ddp_after_5_steps(facts) -> None:
    _, ranks = facts
    for rank in ranks:
        report = rank["parity"]
        assert report["torch DDP"]["vs_torch"] == 0.0  # the reference against itself
        for name in ("naive", "bucketed", "overlapped"):
            assert report[name]["vs_torch"] < PARITY_TOLERANCE, name


def test_every_rank_holds_identical_parameters_after_every_step(facts) -> None:
    _, ranks = facts
    for rank in ranks:
        for name, r in rank["parity"].items():
            assert r["rank_spread"] == 0.0, name


# --- collective counts -----------------------------------------------------------------


def test_naive_launches_one_all_reduce_per_trainable_tensor(facts) -> None:
    _, ranks = facts
    naive = ranks[0]["naive"]
    calls = [x for x in naive["log"] if x[0] == "all_reduce"]
    assert len(calls) == naive["trainable"] == 28  # tok_emb (tied with lm_head) counts once
    assert ranks[0]["parity"]["naive"]["all_reduces_per_step"] == 28


def test_bucketed_and_overlapped_launch_one_all_reduce_per_bucket(facts) -> None:
    _, ranks = facts
    for name in ("bucketed", "overlapped"):
        r = ranks[0][name]
        calls = [numel for kind, numel in r["log"] if kind == "all_reduce"]
        assert 1 < len(calls) == len(r["buckets"]) < r["trainable"], name
        assert [n * 4 for n in calls] == r["bucket_bytes"], "each call sends a whole bucket"
        assert ranks[0]["parity"][name]["all_reduces_per_step"] == len(r["buckets"])


def test_buckets_hold_every_trainable_parameter_once_in_reverse_order(facts) -> None:
    _, ranks = facts
    r = ranks[0]["bucketed"]
    flat = [pid for bucket in r["buckets"] for pid in bucket]
    assert flat == r["order"][::-1]
    cap = int(CAP_MB * MiB)
    assert all(nbytes >= cap for nbytes in r["bucket_bytes"][:-1]), "only the last is short"


# --- overlap -------------------------------------------------------------------------------


def test_first_all_reduce_starts_before_backward_has_produced_every_gradient(facts) -> None:
    _, ranks = facts
    for rank in ranks:
        log = rank["overlapped"]["log"]
        kinds = [kind for kind, _ in log]
        first_call = kinds.index("all_reduce")
        grads_after = kinds[first_call:].count("grad")
        assert grads_after > 0, "overlap: gradients still arrive after the first launch"
        assert kinds.count("grad") == rank["overlapped"]["trainable"]
    # while the non-overlapped variant communicates only after backward is done
    kinds = [kind for kind, _ in ranks[0]["bucketed"]["log"]]
    assert kinds.index("all_reduce") > max(i for i, k in enumerate(kinds) if k == "grad")


def test_overlapped_timeline_launches_buckets_in_order(facts) -> None:
    _, ranks = facts
    timeline = ranks[0]["parity"]["overlapped"]["timeline"]
    launched = [what for kind, what in timeline if kind == "all-reduce"]
    assert launched == [f"bucket {i}" for i in range(len(launched))]
    assert timeline[0][0] == "grad" and timeline[-1] == ("all-reduce", launched[-1])


# --- frozen and unused parameters, no_sync ----------------------------------------------


def test_frozen_parameters_are_skipped_and_unused_ones_average_zeros(world2) -> None:
    ranks = world2
    b = [rank["branchy"] for rank in ranks]
    assert all(x["frozen_grad_is_none"] and x["frozen_in_no_bucket"] for x in b)
    assert torch.equal(b[0]["frozen_weight"], b[1]["frozen_weight"]), "broadcast at init"
    expected = b[0]["expected_rank0_only_grad"]  # rank 1 never used the layer: zeros
    assert expected.abs().sum() > 0
    for x in b:
        assert torch.allclose(x["rank0_only_grad"], expected, rtol=1e-6, atol=0)
        assert x["collectives"] == x["buckets"], "the same collectives on both ranks: no hang"
        # used in an earlier no_sync micro-batch only: kept, not zeroed
        assert torch.allclose(x["accumulated_rank0_only_grad"], expected, rtol=1e-6, atol=0)


def test_no_sync_accumulates_and_all_reduces_once(world2) -> None:
    ranks = world2
    for rank in ranks:
        r = rank["no_sync"]
        assert r["all_reduces"] == r["buckets"], "one all-reduce per bucket for two backwards"
        assert r["max_diff"] < ACCUMULATION_TOLERANCE


# --- mistakes --------------------------------------------------------------------------


def test_misuse_is_a_one_line_usage_error(world2) -> None:
    ranks = world2
    errors = ranks[0]["errors"]
    assert "call loss.backward()" in errors["finish before backward"]
    assert "call finish_gradient_synchronization()" in errors["forward twice"]
    assert "requires_grad_(True)" in errors["all frozen"]
    assert all("\n" not in message for message in errors.values())


@pytest.mark.parametrize("cap", [0, -1.0, math.inf, math.nan, "25"])
def test_bucket_size_must_be_positive(cap) -> None:
    with pytest.raises(UsageError, match=r"bucket_cap_mb must be a positive number of MB.*use e.g"):
        BucketedDDP(nn.Linear(2, 2), bucket_cap_mb=cap)


def test_wrapping_without_a_process_group_names_the_fix() -> None:
    with pytest.raises(UsageError, match=r"call dist\.init_process_group first"):
        NaiveDDP(nn.Linear(2, 2))


# --- the exercise ------------------------------------------------------------------------


def test_forgetting_to_average_makes_the_sgd_update_world_size_times_too_large(world2) -> None:
    ranks = world2
    ratios = ranks[0]["forgetful"]
    assert ratios["sgd"] == pytest.approx(2, rel=1e-5)  # world size 2
    # Adam divides by sqrt(v): a gradient k times larger gives (almost) the same step
    assert ratios["adamw"] == pytest.approx(1.0, abs=1e-3)
    assert ranks[0]["forgetful_collectives"] == 0


# --- the benchmark runs (a smoke test: no timings are asserted) ------------------------


def test_benchmark_measures_every_variant_side_by_side(bench_ddp: ModuleType) -> None:
    """One cheap round of the recorded benchmark, and the recorded table checked.

    The recorded files are tools/figures_week1_ddp.py's run.
    Tolerance on the times: helpers.TIMING_FACTORS["training"].
    """
    bench = bench_ddp
    rows = bench.rows(sweep=(1.0,), rounds=1, steps=1)
    assert [r["kind"] for r in rows] == ["torch", "naive", "bucketed", "overlapped"]
    assert all(r["tokens_per_s"] > 0 for r in rows)
    assert rows[0]["vs_torch"] == 1.0
    assert "vs torch DDP" in bench.report(rows)
    recorded_dir = ROOT / "docs" / "generated" / "week1"
    recorded = json.loads((recorded_dir / "ddp_bench.json").read_text())
    was = recorded[0]["tokens_per_s"]
    assert_timing(rows[0]["tokens_per_s"], was, "training", "ddp_bench tokens/s")
    assert recorded[0]["variant"] == "torch DDP" and recorded[0]["vs_torch"] == 1.0
    for r in recorded:
        assert r["vs_torch"] == pytest.approx(r["tokens_per_s"] / was)
    tool = load_tool("figures_week1_ddp")
    assert (recorded_dir / "ddp_bench.md").read_text() == tool.table(bench, recorded)
