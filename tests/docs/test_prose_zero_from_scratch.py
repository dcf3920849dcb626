"""ZeRO from scratch: the numbers in prose are those of its data (issue 13: numbers in prose
come from data).

- "Peak memory per rank" describes docs/generated/week2/zero_memory.json
  (`python tools/figures_week2_memory.py`): the model's size, and what stages 0-2 peak
  at (stage 3's peak at N = 4 is compared in tests/docs/test_prose.py).
- The ring's share of the paper's 2Ψ and 3Ψ at N = 2 and N = 64: (N − 1) / N, and an
  all-reduce's bytes against a reduce-scatter's (comm_model.ring_allreduce_bytes).
- The tolerances the page quotes are the constants of tests/tinyscale/data_parallel/
  test_zero.py: FORMULA_TOLERANCE (2 %) and PARITY_TOLERANCE (1e-5).
- "Run it": what each stage halves at N = 2 and stage 3's traffic against DDP's, from the
  recorded output of `demo(world_size=2)` (CI re-runs it).
- Stage 2's flattened copy of a unit's gradients, in the peaks of zero_memory.json.
- The collectives the benchmark times (docs/generated/week2/zero_bench.json): gloo's
  reduce-scatter slower than its all-reduce, the ring's faster than both.
- The benchmark's model (benchmarks/bench_zero.py) and the tiny model's units.

The |ZeRO-DDP| the tests measure at N = 4 is checked in
tests/tinyscale/data_parallel/test_zero.py, where the parity run is.
"""

from __future__ import annotations

import json

import pytest

from helpers import (
    ROOT,
    fails_when_changed,
    load_bench,
    load_script,
    load_tool,
    prose,
    recorded_output,
    said,
)
from tinyscale.comm.comm_model import ring_allreduce_bytes
from tinyscale.core.config import preset
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel.memory_calculator import zero_step_bytes

PAGE = "week-2/zero-from-scratch.md"
MEMORY = ROOT / "docs" / "generated" / "week2" / "zero_memory.json"
BENCH = ROOT / "docs" / "generated" / "week2" / "zero_bench.json"


def zero_tests():
    """tests/tinyscale/data_parallel/test_zero.py, for its tolerances."""
    return load_script("test_zero", folder="tests/tinyscale/data_parallel")


def rows() -> dict[tuple[int, int], dict]:
    data = json.loads(MEMORY.read_text())
    return {(r["world"], r["stage"]): r for r in data["rows"]}


def figure_model() -> TinyTransformer:
    return TinyTransformer(load_tool("figures_week2_memory").FIG_CFG)


def check_peaks(text: str) -> None:
    blocks, params = said(
        text, r"runs the same code on a model with (\d+) blocks \(([\d,]+) parameters\)"
    )
    model = figure_model()
    assert int(blocks) == len(model.blocks)
    assert int(params.replace(",", "")) == json.loads(MEMORY.read_text())["params"]
    assert int(params.replace(",", "")) == sum(p.numel() for p in model.parameters())

    recorded = rows()
    said(text, r"Stages 0 and 1 peak at what they hold: they allocate nothing during the step\.")
    assert all(r["peak"] == r["held"] for (_, stage), r in recorded.items() if stage < 2)
    said(
        text,
        r"Stage 2 peaks above what it holds by about \*\*two copies of one block's gradients\*\*",
    )
    block = sum(p.numel() for p in model.blocks[0].parameters())
    norm = sum(p.numel() for p in model.ln_f.parameters())
    extra = {r["peak"] - r["held"] for (_, stage), r in recorded.items() if stage == 2}
    assert extra == {(2 * block + norm) * 4}, "two blocks' fp32 gradients and the final norm's"


def check_flat_copy(text: str) -> None:
    (word,) = said(
        text,
        r"Note the cost: the flattened copy (doubles) that unit's gradient bytes for a moment, "
        r"which the peak below shows\.",
    )
    model = figure_model()
    block = sum(p.numel() for p in model.blocks[0].parameters())
    norm = sum(p.numel() for p in model.ln_f.parameters())
    extra = {r["peak"] - r["held"] for (_, stage), r in rows().items() if stage == 2}
    # the autograd gradients of the unit and their flat copy: two copies, not one
    assert word == "doubles" and extra == {(2 * block + norm) * 4}


def check_ring_share(text: str) -> None:
    at2, n, share = said(
        text,
        r"at N = 2 the ring sends (half) as much, at N = (\d+) (\d+) %",
    )
    assert at2 == "half" and round(100 * (int(n) - 1) / int(n)) == int(share)
    (word,) = said(
        text,
        r"A ring moves \(N−1\)/N of the data per rank for a reduce-scatter or an all-gather, "
        r"(twice) that for an all-reduce",
    )
    assert word == "twice"
    for world in (2, 4, 64):
        reduce_scatter = (world - 1) / world * 1000.0  # bytes per rank, of 1000
        assert ring_allreduce_bytes(size_bytes=1000.0, world_size=world) == 2 * reduce_scatter


def check_tolerances(text: str) -> None:
    tests = zero_tests()
    (objective,) = said(text, r"sharded per stage within (\d+) %\.")
    (padding,) = said(text, r"for our models, far below the (\d+) % the tests allow\.")
    assert int(objective) == int(padding) == round(100 * tests.FORMULA_TOLERANCE)
    (parity,) = said(
        text, r"Adam passes the last-bit differences on\. The tests allow ([\d.e-]+)\."
    )
    assert float(parity) == tests.PARITY_TOLERANCE


def run_it_table() -> dict[int, list[int]]:
    """Stage -> params, grads, optimizer, sent/step of the page's recorded 2-rank run."""
    lines = recorded_output(PAGE, "demo(world_size=2)")
    table = {}
    for line in lines[2:]:
        fields = line.replace(",", "").split()
        table[int(fields[0])] = [int(fields[i]) for i in (2, 3, 4, 6)]
    return table


def check_run_it(text: str) -> None:
    (word,) = said(
        text,
        r"Stage 1 (halves) the optimizer state, stage 2 the gradients too, stage 3 everything\.",
    )
    table = run_it_table()
    held = {stage: row[:3] for stage, row in table.items()}
    assert word == "halves"
    assert held[1] == [held[0][0], held[0][1], held[0][2] // 2]
    assert held[2] == [held[0][0], held[0][1] // 2, held[0][2] // 2]
    assert held[3] == [held[0][0] // 2, held[0][1] // 2, held[0][2] // 2]
    (ratio,) = said(text, r"Stages 0–2 send the same bytes; stage 3 sends ([\d.]+) ×\.")
    sent = {stage: row[3] for stage, row in table.items()}
    assert sent[0] == sent[1] == sent[2] and sent[3] / sent[0] == float(ratio)
    psi = sum(p.numel() for p in TinyTransformer(preset("tiny")).parameters())
    assert sent[3] == zero_step_bytes(stage=3, numel=psi, world=2)


def check_collectives(text: str) -> None:
    (word,) = said(
        text,
        r"the benchmark below shows gloo's reduce-scatter costing \*more\* than its all-reduce "
        r"of the same tensor, which moves (twice) the bytes; Week 1's ring does the same job "
        r"for less\.",
    )
    ms = json.loads(BENCH.read_text())[-1]["collective_ms"]
    assert ms["gloo reduce_scatter"] > ms["gloo all_reduce"], "costing more"
    assert ms["ring reduce_scatter"] < ms["gloo reduce_scatter"], "for less"
    reduce_scatter = (2 - 1) / 2 * 1000.0  # bytes per rank of a 1000-byte tensor at N = 2
    assert word == "twice"
    assert ring_allreduce_bytes(size_bytes=1000.0, world_size=2) == 2 * reduce_scatter


def check_models(text: str) -> None:
    blocks, hidden, millions = said(
        text,
        r"trains the benchmark model \((\d+) blocks, hidden (\d+), ([\d.]+) M parameters\) on "
        r"two ranks",
    )
    bench = load_bench("bench_zero")
    CFG, WORLD = bench.CFG, bench.WORLD
    params = sum(p.numel() for p in TinyTransformer(CFG).parameters())
    assert (int(blocks), int(hidden), WORLD) == (CFG.num_hidden_layers, CFG.hidden_size, 2)
    assert float(millions) == round(params / 1e6, 1)

    psi, block, root = said(
        text,
        r"([\d,]+) is a multiple of 8, and so are the three units \(two blocks of ([\d,]+) and a "
        r"root of ([\d,]+)\), so there is no padding",
    )
    model = TinyTransformer(preset("tiny"))
    sizes = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
    total = sum(p.numel() for p in model.parameters())
    said_sizes = [int(x.replace(",", "")) for x in (psi, block, root)]
    assert said_sizes == [total, sizes[0], total - sum(sizes)] and len(set(sizes)) == 1
    assert all(n % 8 == 0 for n in said_sizes)


@pytest.mark.parametrize(
    "check",
    [
        check_peaks,
        check_flat_copy,
        check_ring_share,
        check_tolerances,
        check_run_it,
        check_collectives,
        check_models,
    ],
)
def test_the_pages_numbers_are_those_of_the_data(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_peaks, "(318,720 parameters)", "(318,000 parameters)"),
        (check_ring_share, "at N = 64 98 %", "at N = 64 95 %"),
        (check_ring_share, "or an all-gather, twice that", "or an all-gather, half that"),
        (check_flat_copy, "flattened copy doubles that", "flattened copy triples that"),
        (check_tolerances, "far below the 2 % the tests", "far below the 5 % the tests"),
        (check_tolerances, "The tests allow 1e-5.", "The tests allow 1e-6."),
        (check_run_it, "stage 3 sends 1.5 ×.", "stage 3 sends 2 ×."),
        (check_collectives, "which moves twice the bytes", "which moves half the bytes"),
        (check_models, "hidden 256, 4.2 M parameters) on", "hidden 256, 4.8 M parameters) on"),
        (check_models, "two blocks of 8,544 and", "two blocks of 8,554 and"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
