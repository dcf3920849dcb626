"""Week 2's comparison page: the numbers that tests/docs/test_generated_week2.py does not
read (issue 13: numbers in prose come from data). That module checks the speed table and
its sentence against the recorded benchmark; this one checks:

- the benchmark's model as the page describes it (4 blocks, hidden 256, 4.2 M parameters,
  four variants, two processes), against benchmarks/bench_zero.py and bench_sharding.py,
  and the two runs of tools/figures_week2_sharding.py;
- the size of our module (code/tinyscale/data_parallel/zero.py, in lines);
- the "measured" cells of the table, which quote the runs the other Week 2 pages record:
  HSDP's 8.4e-7 (fsdp.md's expected output), DeepSpeed's tolerance at N = 4
  (PARAM_TOLERANCE of tests/tinyscale/compat/test_zero_vs_deepspeed.py, which
  docs/generated/week2/deepspeed_zero_n4.txt stays within), torchtitan's 8.16 → 7.40 in
  6 steps (torchtitan.md's expected output), DeepSpeed's 3.00Ψ (workshop/deepspeed.md's
  expected output), bf16's halved all-gather (fsdp.md's expected outputs). Our ZeRO's
  7.2e-7 is checked against the parity run in test_zero.py;
- the plan of the exercise (its recorded output) and the tolerance of the last question.
"""

from __future__ import annotations

import re

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

PAGE = "week-2/comparison.md"
WEEK2 = ROOT / "docs" / "generated" / "week2"


def ds_tests():
    """tests/tinyscale/compat/test_zero_vs_deepspeed.py, for its tolerance."""
    return load_script("test_zero_vs_deepspeed", folder="tests/tinyscale/compat")


def fsdp_all_gathers() -> tuple[int, int]:
    """Bytes rank 0's all-gathers sent in fsdp.md's recorded fp32 and bf16 2-rank runs."""
    sent = []
    for flags in ("--world-size 2 --checkpoint-dir", "--world-size 2 --precision bf16"):
        out = recorded_output("week-2/fsdp.md", f"python -m tinyscale.data_parallel.fsdp {flags}")
        line = next(x for x in out if x.startswith("sent by rank 0"))
        sent.append(int(re.search(r"all_gather_single ([\d,]+)", line)[1].replace(",", "")))
    return sent[0], sent[1]


def check_model(text: str) -> None:
    blocks, hidden, millions = said(
        text,
        r"the same model \((\d+) blocks, hidden (\d+), ([\d.]+) M parameters\) sharded four "
        r"ways in the same two processes",
    )
    sharding = load_bench("bench_sharding")
    VARIANTS, WORLD = sharding.VARIANTS, sharding.WORLD
    CFG = load_bench("bench_zero").CFG
    from tinyscale.core.model import TinyTransformer

    params = sum(p.numel() for p in TinyTransformer(CFG).parameters())
    assert (int(blocks), int(hidden)) == (CFG.num_hidden_layers, CFG.hidden_size)
    assert float(millions) == round(params / 1e6, 1)
    assert len(VARIANTS) == 4 and WORLD == 2
    (runs,) = said(
        text, r"`python tools/figures_week2_sharding\.py` \(which calls the benchmark (\w+)\)"
    )
    assert runs == {2: "twice"}.get(load_tool("figures_week2_sharding").RUNS)


def check_module_size(text: str) -> None:
    (lines,) = said(text, r"\| what it is \| ~(\d+) lines to learn from \|")
    module = ROOT / "code" / "tinyscale" / "data_parallel" / "zero.py"
    assert int(lines) == round(len(module.read_text().splitlines()), -2)


def check_bf16_all_gather(text: str) -> None:
    (cell,) = said(text, r"3\(N−1\)/N · 4Ψ; bf16 (halves) the all-gather \|")
    (prose_word,) = said(text, r"this CPU's bf16 instructions and the (halved) all-gather bytes")
    fp32, bf16 = fsdp_all_gathers()
    assert (cell, prose_word) == ("halves", "halved") and bf16 * 2 == fp32


def check_quoted_runs(text: str) -> None:
    """The table's "measured" cells quote the runs the other Week 2 pages record."""
    (hsdp,) = said(text, r"\[0\.0 at N = 2; HSDP 2 × 2: ([\d.e-]+)\]\(fsdp\.md")
    fsdp = (ROOT / "docs" / "week-2" / "fsdp.md").read_text()
    pattern = r"max \|FSDP - our ZeRO-3\| after 3 steps: (\S+)"
    assert float(re.search(pattern, fsdp)[1]) == 0.0, "FSDP2 at N = 2"
    hsdp_run = fsdp[fsdp.index("HSDP (2 x 2), 4 ranks") :]
    assert float(hsdp) == float(re.search(pattern, hsdp_run)[1])

    (bound,) = said(text, r"stages 1–3, N = 2; within ([\d.e-]+) at N = 4\]\(deepspeed-zero\.md")
    four = (WEEK2 / "deepspeed_zero_n4.txt").read_text()  # deepspeed-zero.md's N = 4 run
    recorded = [float(x) for x in re.findall(r"  (\d\.\de-\d\d)$", four, re.M)]
    assert float(bound) == ds_tests().PARAM_TOLERANCE
    assert len(recorded) == 3 and max(recorded) <= float(bound)

    first, last, steps = said(text, r"trains: ([\d.]+) → ([\d.]+) in (\d+) steps\]\(torchtitan\.md")
    titan_page = (ROOT / "docs" / "week-2" / "torchtitan.md").read_text()
    first_run = titan_page[titan_page.index("Building device mesh with parallelism") :]
    first_run = first_run[: first_run.index("Training completed")]  # its expected output
    titan = [float(x) for x in re.findall(r"step: +\d+ +loss: +([\d.]+)", first_run)]
    assert (float(first), float(last), int(steps)) == (
        round(titan[0], 2),
        round(titan[-1], 2),
        len(titan),
    )

    (traffic,) = said(text, r"\[([\d.]+)Ψ for stages 1–2 by default")
    costs = (ROOT / "docs" / "workshop" / "deepspeed.md").read_text()
    for stage in ("ZeRO-1", "ZeRO-2"):
        row = re.search(rf"^{stage} .*?  ([\d.]+) Ψ \(", costs, re.M)
        assert row and row[1] == traffic, stage


# A line of the exercise's output (compiled here, so that it is not read as a sentence).
PLAN_ROW = re.compile(r"(.+?)\s+states\s+([\d.-]+) GB\s+left for activations\s+([\d.-]+) GB")


def plan() -> dict[str, tuple[float, float]]:
    """The exercise's recorded output: plan -> (GB of states, GB left for activations)."""
    out = recorded_output(PAGE, "psi, gpus, gpu_bytes = 7e9, 16, 80e9")
    rows = [PLAN_ROW.match(x) for x in out]
    return {m[1]: (float(m[2]), float(m[3])) for m in rows}


def check_plan(text: str) -> None:
    (left,) = said(text, r"HSDP leaves (\d+) GB for activations and keeps the weight gathers")
    (saved,) = said(text, r"FSDP over 16 saves (\d+) GB more per GPU but gathers every unit")
    (needed,) = said(text, r"Pick HSDP unless the activations need those (\d+) GB;")
    rows = plan()
    hsdp, fsdp = rows["HSDP: shard 8, replicate 2"], rows["ZeRO-3 / FSDP over 16"]
    assert float(left) == round(hsdp[1])
    assert float(saved) == float(needed) == round(hsdp[0] - fsdp[0])


def check_tolerance(text: str) -> None:
    (allowed,) = said(text, r"The algorithm is the same; the tolerance \(([\d.e-]+) here\) covers")
    zero_tests = load_script("test_zero", folder="tests/tinyscale/data_parallel")
    assert float(allowed) == ds_tests().PARAM_TOLERANCE == zero_tests.PARITY_TOLERANCE


@pytest.mark.parametrize(
    "check",
    [
        check_model,
        check_module_size,
        check_bf16_all_gather,
        check_quoted_runs,
        check_plan,
        check_tolerance,
    ],
)
def test_the_pages_numbers_are_those_of_the_data(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_model, "4.2 M parameters", "4.8 M parameters"),
        (check_quoted_runs, "HSDP 2 × 2: 8.4e-7", "HSDP 2 × 2: 8.4e-6"),
        (check_model, "(which calls the benchmark twice)", "(which calls the benchmark once)"),
        (check_module_size, "~300 lines to learn from", "~500 lines to learn from"),
        (check_bf16_all_gather, "bf16 halves the all-gather", "bf16 doubles the all-gather"),
        (check_quoted_runs, "within 1e-5 at N = 4", "within 1e-6 at N = 4"),
        (check_plan, "HSDP leaves 66 GB", "HSDP leaves 73 GB"),
        (check_plan, "saves 7 GB more", "saves 14 GB more"),
        (check_tolerance, "the tolerance (1e-5 here)", "the tolerance (1e-6 here)"),
        (check_quoted_runs, "trains: 8.16 → 7.40", "trains: 8.16 → 7.69"),
        (check_quoted_runs, "[3.00Ψ for stages", "[2.00Ψ for stages"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
