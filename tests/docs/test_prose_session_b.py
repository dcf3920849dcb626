"""Session B's run- and model-derived words and numbers that tests/docs/test_prose.py does
not read (issue 13: numbers in prose come from data). That module compares the fused
kernels' speed-ups with docs/generated/session_b/fused_kernels.txt; this one checks:

- "`foreach` is no faster here", against the same recorded run;
- the alpha-beta figure's caption: the ring's latency steps and how much the tree wins by
  for small messages, from the model the figure plots (tinyscale.comm.comm_model);
- accumulation: "a quarter of the activation memory", against the peaks the page's own
  expected output records (compared with a fresh run by `pytest --codeblocks`).
"""

from __future__ import annotations

import re

import pytest

from helpers import ROOT, fails_when_changed, prose, said
from tinyscale.comm.comm_model import allreduce_time, ring_allreduce_steps

PAGE = "workshop/session-b.md"
FUSED = ROOT / "docs" / "generated" / "session_b" / "fused_kernels.txt"


def recorded_speedups() -> dict[str, float]:
    """Variant (its first words, up to the parenthesis) -> the speed-up column."""
    rows = re.findall(r"^(.+?) \(.*?\)\s+[\d,]+\s+([\d.]+)x$", FUSED.read_text(), re.M)
    return {name: float(x) for name, x in rows}


def check_foreach(text: str) -> None:
    """The fused kernels' speed-ups are compared in tests/docs/test_prose.py; this is the rest."""
    said(text, r"`foreach` is no faster here: on a CPU its multi-tensor ops are a loop")
    recorded = recorded_speedups()
    assert recorded["AdamW foreach=False"] == 1.0, "the baseline"
    assert recorded["AdamW foreach=True"] <= 1.0, "no faster"


def check_alpha_beta_caption(text: str) -> None:
    steps, wins = said(
        text,
        r"for small messages the ring's (\d+) latency steps dominate and the tree wins by (\d+)×",
    )
    # the right panel of session_b/allreduce.png: 256 GPUs, 5 µs, 25 GB/s
    link = dict(world_size=256, alpha_s=5e-6, bandwidth_bps=25e9)
    assert int(steps) == ring_allreduce_steps(256)
    smallest = 2**10  # the figure's first message size
    ratio = allreduce_time("ring", size_bytes=smallest, **link) / allreduce_time(
        "tree", size_bytes=smallest, **link
    )
    assert int(wins) == round(ratio, -1)


def check_accumulation(text: str) -> None:
    (fraction,) = said(
        text, r"Same loss, same gradient, (a quarter|a half|an eighth) of the activation memory"
    )
    whole, micro = (float(x) for x in re.findall(r"peak activations ([\d.]+) MiB", text))
    share = {"a half": 2, "a quarter": 4, "an eighth": 8}[fraction]
    assert round(whole / micro, 1) == share


@pytest.mark.parametrize("check", [check_foreach, check_alpha_beta_caption, check_accumulation])
def test_the_pages_numbers_are_those_of_the_data(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_alpha_beta_caption, "tree wins by 30×", "tree wins by 60×"),
        (check_accumulation, "gradient, a quarter of", "gradient, a half of"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
