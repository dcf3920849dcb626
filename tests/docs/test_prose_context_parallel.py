"""Context parallelism from scratch: the numbers in its prose are those of its data.

- the tolerances the page quotes, against the constants of
  tests/tinyscale/context_parallel/test_context_parallel.py;
- the imbalance 2N/(N + 1) at N = 4, against the ring's recorded count (Exercise 1);
- the bytes sent and saved at T = 256 on 2 ranks, against the demo's recorded output;
- the memory per rank at T = 4,096, against docs/generated/week5/cp_memory.json.
"""

from __future__ import annotations

import json
import re
from fractions import Fraction

from helpers import ROOT, fails_when_changed, load_script, prose, recorded_output, said

PAGE = "week-5/context-parallel.md"
ROWS = json.loads((ROOT / "docs" / "generated" / "week5" / "cp_memory.json").read_text())["rows"]


def constants():
    return load_script("test_context_parallel", folder="tests/tinyscale/context_parallel")


def check_tolerances(text: str) -> None:
    test = constants()
    (attention,) = said(text, r"requires the output and every gradient within ([\de-]+)\.")
    assert float(attention) == test.ATTENTION_TOLERANCE
    (merge,) = said(text, r"holds the course's `merge` to ([\de-]+) and")
    assert float(merge) == test.ATTENTION_TOLERANCE
    loss, values = said(
        text, r"It requires loss < ([\de-]+), and logits and gradients < ([\de-]+)\."
    )
    assert (float(loss), float(values)) == (test.LOSS_TOLERANCE, test.VALUE_TOLERANCE)


def test_the_tolerances_are_the_tests() -> None:
    fails_when_changed(check_tolerances, prose(PAGE), "loss < 1e-5", "loss < 1e-4")


def check_imbalance(text: str) -> None:
    (n, fraction) = said(text, r"the slowest works 2N/\(N \+ 1\) = (\d)/(\d) of the mean")
    ratio = Fraction(int(n), int(fraction))
    assert ratio == Fraction(2 * 4, 4 + 1)
    recorded = "\n".join(recorded_output(PAGE, "work_per_rank, 4, 64"))
    measured = re.search(r"contiguous: .*slowest / mean ([\d.]+)", recorded)
    assert measured and float(measured[1]) == round(float(ratio), 2)


def test_the_imbalance_is_the_measured_one() -> None:
    fails_when_changed(check_imbalance, prose(PAGE), "= 8/5 of the mean", "= 7/5 of the mean")


def test_the_bytes_at_256_are_the_demos() -> None:
    text = prose(PAGE)
    ring_sent, gathered_sent, ring_saved, gathered_saved = said(
        text,
        r"At T = 256 the ring sends ([\d,]+) bytes per rank over both passes and the "
        r"all-gather ([\d,]+); the ring saves ([\d,]+) bytes and the all-gather ([\d,]+)\.",
    )
    rows = {}
    for line in recorded_output(PAGE, "allgather_kv import demo"):
        cells = re.findall(r"[\d,]+(?= \()", line)
        if line.split()[1:2] == ["256"]:
            rows[line.split()[0]] = [int(c.replace(",", "")) for c in cells]
    assert int(ring_sent.replace(",", "")) == rows["ring"][0] + rows["ring"][1]
    assert int(gathered_sent.replace(",", "")) == rows["all-gather"][0] + rows["all-gather"][1]
    assert int(ring_saved.replace(",", "")) == rows["ring"][2]
    assert int(gathered_saved.replace(",", "")) == rows["all-gather"][2]


def test_the_memory_claims_hold_for_the_json() -> None:
    text = prose(PAGE)
    saved = {(r["world"], r["variant"], r["seq_len"]): r["saved"] for r in ROWS}
    ring4, one = said(
        text, r"([\d,]+) bytes per rank at T = 4,096 on 4 ranks, where one process saves ([\d,]+)\."
    )
    assert int(ring4.replace(",", "")) == saved[(4, "ring", 4096)]
    assert int(one.replace(",", "")) == saved[(1, "ring", 4096)] == 4 * saved[(4, "ring", 4096)]
    (gathered4,) = said(
        text,
        r"only shrinks its q and out: ([\d,]+) bytes per rank at T = 4,096 on 4 ranks, more than the ring saves on 2\.",
    )
    assert (
        int(gathered4.replace(",", "")) == saved[(4, "all-gather", 4096)] > saved[(2, "ring", 4096)]
    )


def test_the_planners_choice_is_its_recorded_output() -> None:
    """The sentence after the planner's block names the cp and tp of its recorded line."""
    cp, tp = said(prose(PAGE), r"So it picks cp (\d) beside tp (\d), a ring of")
    recorded = "\n".join(recorded_output(PAGE, "--seq-len 131072"))
    assert f"dp  1 x cp {cp} x tp {tp} x pp 1" in recorded
