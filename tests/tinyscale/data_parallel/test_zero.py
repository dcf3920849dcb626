"""ZeRO stages 0-3 from scratch (tinyscale.data_parallel.zero, tinyscale.data_parallel.zero_vs_ddp) against DDP, on gloo.

One run_on_ranks launch per world size (2 and 4) trains torch DDP + torch AdamW and our
stages 0-3 from the same per-rank random init, and returns facts; the tests assert:

- parity: every stage ends 3 AdamW steps within PARITY_TOLERANCE of the DDP baseline,
  and all ranks hold bit-identical parameters;
- memory: the bytes of weights, gradients and optimizer state each rank holds, counted
  from the tensors, are within 2 % of the fp32 formula 4Ψ + 4Ψ + 8Ψ sharded per stage;
- traffic: the bytes the wrapped collectives move per step equal 2(N-1)/N Ψ (stages 0-2)
  and 3(N-1)/N Ψ (stage 3) exactly, for the padded Ψ;
- bad input: stage, optimizer, missing process group, a world too large for a unit, and a
  gradient that completes after its unit was reduce-scattered (a parameter two units use);
- the pages: the |ZeRO-DDP| that zero-from-scratch.md and comparison.md quote is measured.
"""

import importlib
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from helpers import one_line_error, prose, said
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.errors import UsageError
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel.memory_calculator import zero_state_bytes, zero_step_bytes
from tinyscale.data_parallel.zero import FlatAdamW, ZeRO
from tinyscale.data_parallel.zero_vs_ddp import bad_world_size, compare_stages

# Ours and DDP sum the same gradients, but gloo's all-reduce over DDP's buckets and our
# reduce-scatter over our flat units may add an element's N terms in another order:
# the last bits differ (measured: 0.0 at N=2, 7.2e-7 at N=4 after 3 steps).
PARITY_TOLERANCE = 1e-5
FORMULA_TOLERANCE = 0.02  # the brief's 2 %: padding to a multiple of N adds < N per unit


def facts(world: int) -> dict:
    out = {"stages": compare_stages()}
    if world == 2:
        out["bad_world"] = bad_world_size()
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=["world2", "world4"])
def world_facts(request) -> tuple[int, list[dict]]:
    return request.param, run_on_ranks(facts, request.param, request.param, deadline_s=240)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_stage_matches_ddp_and_ranks_agree(world_facts, stage) -> None:
    world, ranks = world_facts
    for r in ranks:
        s = r["stages"][stage]
        assert s["vs_ddp"] < PARITY_TOLERANCE, (world, stage, s["vs_ddp"])
        assert s["rank_spread"] == 0.0


# What the pages say the parity run measures. On the course's machine N = 4 gives 7.23e-7,
# the pages' 7.2e-7; other CPUs' kernels round the same sums differently in the last bits.
PAGE_FIGURE_TOLERANCE = 0.2


def check_parity_figures(zero: str, comparison: str, world: int, vs_ddp: float) -> None:
    """zero-from-scratch.md and comparison.md quote |ZeRO-DDP| at N = 2 and N = 4."""
    if world == 2:
        said(zero, r"`\|ZeRO-DDP\|` is 0 at N = 2: every stage ends exactly where DDP ends")
        assert vs_ddp == 0.0
        return
    (page,) = said(zero, r"At N = 4 the tests measure ([\d.e-]+) \(the same for all four stages\)")
    (table,) = said(comparison, r"DDP: 0\.0 at N = 2, ([\d.e-]+) at N = 4")
    (question,) = said(zero, r"Why does the world-size-4 run differ from DDP by (\de-\d), not 0\?")
    assert page == table and float(question) == float(f"{float(page):.0e}")
    assert float(page) == pytest.approx(vs_ddp, rel=PAGE_FIGURE_TOLERANCE), vs_ddp


def test_the_pages_say_what_the_parity_run_measures(world_facts) -> None:
    world, ranks = world_facts
    measured = {r["stages"][s]["vs_ddp"] for r in ranks for s in range(4)}
    assert len(measured) == 1, "the same for all four stages, on every rank"
    zero, comparison = prose("week-2/zero-from-scratch.md"), prose("week-2/comparison.md")
    check_parity_figures(zero, comparison, world, measured.pop())


def test_self_check_a_changed_parity_figure_fails() -> None:
    zero, comparison = prose("week-2/zero-from-scratch.md"), prose("week-2/comparison.md")
    check_parity_figures(zero, comparison, 4, 7.23e-7)  # measured on the course's machine
    for changed in (
        (  # both pages, alike: no longer what the run measures
            zero.replace("tests measure 7.2e-7", "tests measure 1.0e-6"),
            comparison.replace(", 7.2e-7 at N = 4", ", 1.0e-6 at N = 4"),
        ),
        (zero, comparison.replace(", 7.2e-7 at N = 4", ", 7.0e-7 at N = 4")),  # disagree
        (zero.replace("from DDP by 7e-7, not 0", "from DDP by 8e-7, not 0"), comparison),
    ):
        with pytest.raises(AssertionError):
            check_parity_figures(*changed, 4, 7.23e-7)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_bytes_held_per_rank_match_the_fp32_formula(world_facts, stage) -> None:
    world, ranks = world_facts
    for r in ranks:
        psi = r["stages"]["numel"]
        want = zero_state_bytes(psi, stage=stage, world_size=world, precision="fp32")
        got = r["stages"][stage]["held"]
        for measured, formula in zip(got, (want.params, want.grads, want.optimizer), strict=True):
            assert measured == pytest.approx(formula, rel=FORMULA_TOLERANCE), (stage, got, want)


def test_each_stage_holds_less_than_the_one_before(world_facts) -> None:
    _, ranks = world_facts
    totals = [sum(ranks[0]["stages"][s]["held"]) for s in range(4)]
    assert totals == sorted(totals, reverse=True) and len(set(totals)) == 4, totals


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_bytes_sent_per_step_are_2_or_3_psi_times_n_minus_1_over_n(world_facts, stage) -> None:
    world, ranks = world_facts
    for r in ranks:
        s = r["stages"][stage]
        exact = zero_step_bytes(stage=stage, numel=s["padded"], world=world)
        assert s["sent"] == pytest.approx(exact, rel=1e-12)
        psi = r["stages"]["numel"]
        assert s["sent"] == pytest.approx(exact * psi / s["padded"], rel=FORMULA_TOLERANCE)


def test_collective_calls_per_stage(world_facts) -> None:
    _, ranks = world_facts
    calls = {s: dict(ranks[0]["stages"][s]["calls"]) for s in range(4)}
    units = 3  # two blocks and the root (embeddings, final norm)
    assert calls[0] == {"all_reduce": units}
    assert calls[1] == calls[2] == {"reduce_scatter_single": units, "all_gather_single": units}
    assert calls[3] == {"reduce_scatter_single": units, "all_gather_single": 2 * units}


def test_peak_model_state_bytes_are_at_least_what_is_held(world_facts) -> None:
    _, ranks = world_facts
    stages = ranks[0]["stages"]
    for s in range(4):
        assert stages[s]["peak"] >= sum(stages[s]["held"])
    assert stages[0]["peak"] == sum(stages[0]["held"])  # DDP never holds more than 16Ψ
    assert stages[3]["peak"] < stages[0]["peak"]


def test_world_size_larger_than_a_unit_is_a_one_line_error(world_facts) -> None:
    world, ranks = world_facts
    if world != 2:
        pytest.skip("checked in the world-size-2 launch")
    for r in ranks:
        assert "world size 2 is larger than unit 'Linear' (1 parameters)" in r["bad_world"]
        assert "\n" not in r["bad_world"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"stage": 4}, "ZeRO stage 4 does not exist: use --stage 0, 1, 2 or 3"),
     ({"stage": 1, "optimizer": "sgd"}, "'sgd' is not supported by tinyscale.data_parallel.zero: use 'adamw'"),
     ({"stage": 1}, "needs a process group")],
)  # fmt: skip
def test_bad_input_is_a_one_line_usage_error(kwargs, message) -> None:
    with pytest.raises(UsageError, match=message) as err:
        ZeRO(torch.nn.Linear(4, 4), **kwargs)
    assert "\n" not in str(err.value)


def test_flat_adamw_is_torch_adamw_bit_for_bit() -> None:
    torch.manual_seed(0)
    ours_p = torch.randn(1000)
    theirs_p = torch.nn.Parameter(ours_p.clone())
    ours = FlatAdamW(lr=1e-2, weight_decay=0.1)
    ours.add(ours_p)
    theirs = torch.optim.AdamW([theirs_p], lr=1e-2, weight_decay=0.1, foreach=False)
    for _ in range(5):
        grad = torch.randn(1000)
        ours.step([ours_p], [grad])
        theirs_p.grad = grad.clone()
        theirs.step()
    assert torch.equal(ours_p, theirs_p.detach())
    state = theirs.state[theirs_p]
    assert torch.equal(ours.exp_avg[0], state["exp_avg"])
    assert torch.equal(ours.exp_avg_sq[0], state["exp_avg_sq"])
    assert math.isclose(ours_p.sub(theirs_p.detach()).abs().max().item(), 0.0)


def test_recorded_figure_numbers_match_the_formula() -> None:
    """docs/generated/week2/zero_memory.json (tools/figures_week2_memory.py) is what the page plots."""
    path = Path(__file__).resolve().parents[3] / "docs/generated/week2/zero_memory.json"
    data = json.loads(path.read_text())
    assert {(r["world"], r["stage"]) for r in data["rows"]} == {
        (n, s) for n in (1, 2, 4) for s in range(4)
    }
    for r in data["rows"]:
        want = zero_state_bytes(data["params"], stage=r["stage"], world_size=r["world"])
        assert r["held"] == pytest.approx(want.total, rel=FORMULA_TOLERANCE)
        assert r["formula"] == want.total
        assert r["peak"] >= r["held"]


def test_benchmark_measures_every_stage_side_by_side() -> None:
    """benchmarks/bench_zero.py at 1 round: every stage runs; bytes are 2Ψ-like and 3Ψ-like."""
    path = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_zero.py"
    sys.path.insert(0, str(path.parent))  # the spawned ranks import bench_zero by name
    try:
        bench = importlib.import_module("bench_zero")
        table = bench.rows(rounds=1, steps=1)
    finally:
        sys.path.remove(str(path.parent))
    *table, costs = table
    assert [r["variant"] for r in table] == list(bench.VARIANTS)
    assert all(r["tokens_per_s"] > 0 for r in table)
    sent = [r["bytes_sent_per_step"] for r in table]
    assert sent[0] == sent[1] == sent[2] > 0
    assert sent[3] == pytest.approx(1.5 * sent[0], rel=1e-12)
    model = TinyTransformer(bench.CFG)
    root = sum(p.numel() for p in model.parameters()) - sum(
        p.numel() for p in model.blocks.parameters()
    )
    assert sent[4] == sent[5] == sent[3] - 4 * math.ceil(root / 2)  # the root stays for backward
    peak = {r["variant"]: r["peak_bytes"] for r in table}
    block = 4 * sum(p.numel() for p in model.blocks[0].parameters())
    assert peak["3 + prefetch"] - peak["3"] == block  # one block gathered early
    assert costs["block_bytes"] == block
    assert list(costs["collective_ms"]) == list(bench.COLLECTIVES)
    assert all(ms > 0 for ms in costs["collective_ms"].values())
    # a header per table, two blank lines, the bound's 5 rows and 2 lines of ratios, the setup
    bound_rows = ["step", "collectives alone", "CPU", "of it collectives", "cores busy"]
    assert (
        bench.report([*table, costs], rounds=1).count("\n")
        == len(table) + len(costs["collective_ms"]) + 3 + 1 + len(bound_rows) + 2 + 1
    )


class SharedWeight(torch.nn.Module):
    """``b.weight`` is also used before ``b`` runs, outside it: its gradient is complete only
    after backward has passed ``b``."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        return self.b(h + torch.nn.functional.linear(h, self.b.weight))


def test_a_gradient_after_its_units_reduce_scatter_is_refused(process_group_of_one) -> None:
    model = SharedWeight()
    zero = ZeRO(model, stage=2, units=[model.b])
    message = one_line_error(lambda: zero(torch.ones(1, 2)).sum().backward())
    assert message.startswith("a parameter of unit Linear got its gradient after the unit was")
    whole = ZeRO(SharedWeight(), stage=2)  # b in the root, with everything that uses it
    whole(torch.ones(1, 2)).sum().backward()
    whole.step()
