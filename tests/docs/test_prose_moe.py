"""The numbers in the prose of docs/week-3/moe.md that tests/docs/test_generated_week3_moe.py
and the compat tests do not read, against the model, the code and the recorded runs:

- the FFN's share of a block of the course model;
- Step 2's worked capacity, against the routing demo's config and ``capacity``;
- the five variants' settings and the runs' schedule, against
  docs/generated/week3/moe_curves.json and the code that builds them;
- the held-out blocks the drop rates are measured on;
- the bias rate, ours and torchtitan's default;
- the expert-parallel bytes, against the demo's settings and ``all_to_all_bytes``;
- the exercise's capacity and the torchtitan parameter line's arithmetic.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import re
from pathlib import Path

import pytest

from helpers import ROOT, fails_when_changed, prose, recorded_output, said
from tinyscale.core.config import ModelConfig
from tinyscale.core.model import TinyTransformer
from tinyscale.expert_parallel import ep_moe, moe_compare, moe_routing
from tinyscale.expert_parallel.moe_routing import MoEConfig, capacity

PAGE = "week-3/moe.md"
DATA = json.loads((ROOT / "docs" / "generated" / "week3" / "moe_curves.json").read_text())
RUNS = DATA["runs"]


def numbers(*found: str) -> list[float]:
    return [float(x.replace(",", "")) for x in found]


def check_ffn_share(text: str) -> None:
    (share,) = said(
        text, r"the FFN holds most of the parameters \((\d+) % of a block of the course model\)"
    )
    block = TinyTransformer(ModelConfig()).blocks[0]
    ffn = sum(p.numel() for p in block.ffn.parameters())
    total = sum(p.numel() for p in block.parameters())
    assert int(share) == round(100 * ffn / total) and ffn / total > 1 / 2


def check_worked_capacity(text: str) -> None:
    (factor,) = said(
        text, r"Twelve tokens, four experts, top 2, and a factor of ([\d.]+) \(too small"
    )
    source = inspect.getsource(moe_routing.demo)
    assert f"MoEConfig(num_experts=4, top_k=2, capacity_factor={factor})" in source
    assert "torch.randn(12, 8)" in source
    k, tokens, experts, again, product, slots = said(
        text, r"C = ⌈(\d+) · (\d+) / (\d+) · ([\d.]+)⌉ = ⌈([\d.]+)⌉ = (\d+)\. The"
    )
    assert again == factor
    cfg = MoEConfig(num_experts=int(experts), top_k=int(k), capacity_factor=float(factor))
    assert float(product) == round(int(k) * int(tokens) / int(experts) * float(factor), 1)
    assert int(slots) == math.ceil(float(product)) == capacity(int(tokens), cfg)


def check_variants(text: str) -> None:
    wider, width = said(text, r"`dense-wide`: its FFN (\d+) times wider \(([\d,]+)\), as many")
    moe = DATA["moe"]
    assert int(wider) == moe["num_experts"] // moe["top_k"]
    assert int(width.replace(",", "")) == ModelConfig().intermediate_size * int(wider)
    assert "* moe.num_experts // moe.top_k" in inspect.getsource(moe_compare.build)
    assert abs(RUNS["dense-wide"]["parameters"] / RUNS["moe"]["parameters"] - 1) < 0.01
    aux, z = said(text, r"with the aux loss \(coefficient ([\d.]+)\) and the z-loss \(([\d.]+)\)")
    assert (float(aux), float(z)) == (moe["aux_loss_coef"], moe["z_loss_coef"])
    assert (float(aux), float(z)) == (MoEConfig().aux_loss_coef, MoEConfig().z_loss_coef)


def check_schedule(text: str) -> None:
    first, schedule, full = said(
        text,
        r"The MoE's first (\d+) steps of the (\d+)-step schedule that the recorded runs below "
        r"use \(leave out `--max-steps` for all (\d+) steps",
    )
    assert int(first) == DATA["eval_every"] and int(schedule) == int(full) == DATA["steps"]
    assert f"--steps {schedule} --max-steps {first} --variants moe" in text
    (recorded,) = said(text, r"The same for (\d+) steps \(`python tools/figures_week3_moe\.py`")
    (after,) = said(text, r"after (\d+) steps it is the worst of the five")
    assert int(recorded) == int(after) == DATA["steps"]


def check_heldout_blocks(text: str) -> None:
    blocks, tokens = said(text, r"would drop on (\d+) held-out blocks \(([\d,]+) tokens\)")
    assert f"torch.arange({blocks})" in inspect.getsource(moe_compare.drop_rates)
    block_size = 64  # build_datasets(..., block_size=64) in moe_compare.main
    assert "block_size=64" in inspect.getsource(moe_compare.main)
    assert int(tokens.replace(",", "")) == int(blocks) * block_size
    for variant in ("moe", "moe-bias", "moe-none"):  # top 1: one assignment per token
        assert all(sum(layer) == int(blocks) * block_size for layer in RUNS[variant]["load"])


def check_bias_rate(text: str) -> None:
    (rate,) = said(text, r"We use a rate of ([\d.]+) per step;")
    assert float(rate) == DATA["moe"]["bias_rate"] == MoEConfig().bias_rate


def check_ep_bytes(text: str) -> None:
    k, tokens, hidden, rows, experts, count, per_rank = said(
        text,
        r"Here k = (\d+), T = (\d+) tokens per rank, H = (\d+) and fp32: 4 · \1 · \2 · \3 · 4 = "
        r"([\d,]+) bytes of rows, plus (\d+) experts × (\d+) bytes of counts: ([\d,]+) per rank",
    )
    k, tokens, hidden, rows, experts, count, per_rank = map(
        int, numbers(k, tokens, hidden, rows, experts, count, per_rank)
    )
    parity = inspect.signature(ep_moe.parity).parameters
    world = inspect.signature(ep_moe.demo).parameters["world_size"].default
    source = inspect.getsource(ep_moe.parity)
    assert parity["tokens"].default == tokens and f"top_k={k}" in source
    assert f"MoE({hidden}, " in source and experts == 2 * world  # num_experts=2 * ep
    assert rows == ep_moe.all_to_all_bytes(tokens, k, hidden) == 4 * k * tokens * hidden * 4
    assert count == 8  # an int64 count per expert
    assert per_rank == rows + count * experts
    assert f"{world} x {per_rank:,} (formula)" in "\n".join(
        recorded_output(PAGE, "ep_moe import demo")
    )


def check_memory_answer(text: str) -> None:
    (ratio,) = said(text, r"live in memory: (\d\.\d) times the dense model's parameters here")
    assert float(ratio) == round(RUNS["moe"]["parameters"] / RUNS["dense"]["parameters"], 1)


def check_capacity_exercise(text: str) -> None:
    sequences, length, experts, k = said(
        text,
        r"A batch holds (\d+) sequences of ([\d,]+) tokens, an MoE layer has (\d+) experts, "
        r"top (\d+) \(DeepSeek-V3's shape",
    )
    length = int(length.replace(",", ""))
    assert f"tokens = {sequences} * {length}" in text
    assert f"MoEConfig(num_experts={experts}, top_k={k}, capacity_factor=1.25)" in text
    found = said(
        text,
        r"k·T/E = (\d+) × ([\d,]+) / (\d+) = ([\d,]+) rows per expert on average; 1\.25 of "
        r"that is ([\d,]+)\. Every token is sent (\d+) times: ([\d,]+) rows",
    )
    k2, tokens, e2, mean, slots, sent, rows = map(int, numbers(*found))
    assert (k2, e2, sent) == (int(k), int(experts), int(k))
    assert tokens == int(sequences) * length and mean == k2 * tokens // e2
    cfg = MoEConfig(num_experts=e2, top_k=k2, capacity_factor=1.25)
    assert slots == capacity(tokens, cfg) == mean * 1.25 and rows == k2 * tokens


def check_titan_parameters(text: str) -> None:
    found = said(
        text,
        r"per block, (\d+) experts × 3 × (\d+) × (\d+) routed weights, the shared expert's "
        r"3 × \2 × (\d+) and the router's \2 × \1, times (\d+) blocks: ([\d,]+)\.",
    )
    experts, dim, hidden, shared, blocks, sparse = map(int, numbers(*found))
    routed = experts * 3 * dim * hidden
    assert sparse == blocks * (routed + 3 * dim * shared + dim * experts)
    total, twice, block_routed, active = map(
        int, numbers(*said(text, r": ([\d,]+) − (\d+) × 5/8 × ([\d,]+) = ([\d,]+)\."))
    )
    line = next(x for x in recorded_output(PAGE, "--config tinyscale_moe 2>&1") if "dense" in x)
    dense, recorded_sparse, recorded_active = map(
        int,
        numbers(*re.search(r"dense ([\d,]+), sparse ([\d,]+), .*active ([\d,]+)", line).groups()),
    )
    assert recorded_sparse == sparse and total == dense + sparse
    assert (twice, block_routed) == (blocks, routed)
    assert active == recorded_active == total - blocks * routed * 5 // 8


CHECKS = [
    check_ffn_share, check_worked_capacity, check_variants, check_schedule,
    check_heldout_blocks, check_bias_rate, check_ep_bytes, check_memory_answer,
    check_capacity_exercise, check_titan_parameters,
]  # fmt: skip


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_those_of_the_code_and_runs(check) -> None:
    check(prose(PAGE))


def torchtitan_moe_source() -> str:
    spec = importlib.util.find_spec("torchtitan")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("torchtitan is in the cluster extra: make setup")
    folder = Path(next(iter(spec.submodule_search_locations)))
    return (folder / "models" / "common" / "moe.py").read_text()


def check_titan_bias_rate(text: str) -> None:
    (rate,) = said(text, r"the rate is `load_balance_coeff` \(([\d.]+)\)")
    (default,) = re.findall(
        r"load_balance_coeff: float \| None = ([\de.-]+)", torchtitan_moe_source()
    )
    assert float(rate) == float(default)
    titan_config = (ROOT / "code" / "tinyscale" / "compat" / "titan_config.py").read_text()
    assert "load_balance_coeff" not in titan_config  # our config keeps torchtitan's default


def test_the_torchtitan_rate_is_its_default() -> None:
    check_titan_bias_rate(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_ffn_share, "(66 % of a block", "(50 % of a block"),
        (check_worked_capacity, "= ⌈4.8⌉ = 5.", "= ⌈4.8⌉ = 4."),
        (check_variants, "its FFN 8 times wider (2,048)", "its FFN 4 times wider (2,048)"),
        (check_variants, "(coefficient 0.01)", "(coefficient 0.1)"),
        (check_schedule, "after 200 steps it is", "after 400 steps it is"),
        (check_heldout_blocks, "(4,096 tokens)", "(8,192 tokens)"),
        (check_bias_rate, "a rate of 0.01 per", "a rate of 0.1 per"),
        (check_ep_bytes, "= 24,576 bytes of rows", "= 24,567 bytes of rows"),
        (check_memory_answer, "memory: 3.7 times", "memory: 2.7 times"),
        (check_capacity_exercise, "1.25 of that is 2,560.", "1.25 of that is 2,048."),
        (check_titan_parameters, "times 2 blocks: 3,936,256.", "times 3 blocks: 3,936,256."),
        (check_titan_bias_rate, "`load_balance_coeff` (0.001)", "`load_balance_coeff` (0.01)"),
    ],
)  # fmt: skip
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    if check is check_titan_bias_rate:
        torchtitan_moe_source()  # skips where torchtitan is not installed
    fails_when_changed(check, prose(PAGE), old, new)
