"""Week 2's comparison page: the numbers that tests/docs/test_generated_week2.py does not
read (issue 13: numbers in prose come from data). That module checks the speed table and
its sentence against the recorded benchmark; this one checks:

- the benchmark's model as the page describes it (4 blocks, hidden 256, 4.2 M parameters,
  four variants, two processes), against benchmarks/bench_zero.py and bench_sharding.py;
- the "measured" cells of the table, which quote the runs the other Week 2 pages record:
  HSDP's 8.4e-7 (fsdp.md's expected output), DeepSpeed's 9.0e-7 at N = 4
  (docs/generated/week2/deepspeed_zero_n4.txt), torchtitan's 8.16 → 7.40 in 6 steps
  (torchtitan.md's expected output), DeepSpeed's 3.00Ψ (workshop/deepspeed.md's expected
  output). Our ZeRO's 7.2e-7 is checked against the parity run in test_zero.py.
"""

from __future__ import annotations

import re
import sys

import pytest

from helpers import ROOT, fails_when_changed, prose, said

PAGE = "week-2/comparison.md"
WEEK2 = ROOT / "docs" / "generated" / "week2"


def check_model(text: str) -> None:
    blocks, hidden, millions = said(
        text,
        r"the same model \((\d+) blocks, hidden (\d+), ([\d.]+) M parameters\) sharded four "
        r"ways in the same two processes",
    )
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from bench_sharding import VARIANTS, WORLD
        from bench_zero import CFG
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from tinyscale.core.model import TinyTransformer

    params = sum(p.numel() for p in TinyTransformer(CFG).parameters())
    assert (int(blocks), int(hidden)) == (CFG.num_hidden_layers, CFG.hidden_size)
    assert float(millions) == round(params / 1e6, 1)
    assert len(VARIANTS) == 4 and WORLD == 2


def check_quoted_runs(text: str) -> None:
    """The table's "measured" cells quote the runs the other Week 2 pages record."""
    (hsdp,) = said(text, r"\[0\.0 at N = 2; HSDP 2 × 2: ([\d.e-]+)\]\(fsdp\.md")
    fsdp = (ROOT / "docs" / "week-2" / "fsdp.md").read_text()
    pattern = r"max \|FSDP - our ZeRO-3\| after 3 steps: (\S+)"
    assert float(re.search(pattern, fsdp)[1]) == 0.0, "FSDP2 at N = 2"
    hsdp_run = fsdp[fsdp.index("HSDP (2 x 2), 4 ranks") :]
    assert float(hsdp) == float(re.search(pattern, hsdp_run)[1])

    (bound,) = said(text, r"stages 1–3, N = 2; ≤ ([\d.e-]+) at N = 4\]\(deepspeed-zero\.md")
    four = (WEEK2 / "deepspeed_zero_n4.txt").read_text()  # deepspeed-zero.md's N = 4 run
    assert float(bound) == max(float(x) for x in re.findall(r"  (\d\.\de-\d\d)$", four, re.M))

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


@pytest.mark.parametrize("check", [check_model, check_quoted_runs])
def test_the_pages_numbers_are_those_of_the_data(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_model, "4.2 M parameters", "4.8 M parameters"),
        (check_quoted_runs, "HSDP 2 × 2: 8.4e-7", "HSDP 2 × 2: 8.4e-6"),
        (check_quoted_runs, "≤ 9.0e-7 at N = 4", "≤ 8.4e-7 at N = 4"),
        (check_quoted_runs, "trains: 8.16 → 7.40", "trains: 8.16 → 7.69"),
        (check_quoted_runs, "[3.00Ψ for stages", "[2.00Ψ for stages"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
