"""Lab 3's run-derived words and numbers that tests/docs/test_prose.py does not read
(issue 13: numbers in prose come from data). That module compares the scaling
sentence's three speed-ups with the tables; this one checks the rest:

- the shape that sentence claims (two nodes barely beat one, four are slower than one,
  never beyond 2×, lower at 4 than at 2, Lab 2's quieter run higher), and the settings of
  the runs it describes, against docs/generated/lab3/scaling.json and lab2/world_sizes.json;
- the barrier's recorded run (docs/generated/lab3/barrier.json, barrier_timeout.txt): the
  ranks 0.5 s apart, the 3 s timeout, everyone leaving within a few milliseconds of the
  last arrival, the first rank waiting as long as the last was late;
- the slack the two-rank barrier's compared block allows, as the page states it;
- the gradients that cross the loopback: the Lab config's parameters in fp32.

Speed-ups differ from run to run: when `make figures` records new ones, these tests fail
until the sentence says what the new recording says.
"""

from __future__ import annotations

import json

import pytest

from helpers import ROOT, fails_when_changed, prose, said
from tinyscale.core.config import load_model_config
from tinyscale.core.model import TinyTransformer

PAGE = "workshop/lab-3.md"
GENERATED = ROOT / "docs" / "generated"


def speedups(path: str) -> dict[int, float]:
    """tokens/s of the whole job against the run of one process, per world size."""
    runs = json.loads((GENERATED / path).read_text())["runs"]
    base = runs["1"]["tokens_per_second"]
    return {int(n): run["tokens_per_second"] / base for n, run in runs.items()}


def check_scaling(text: str) -> None:
    """The shape the sentence claims, and the runs' settings; its three speed-ups are
    compared with the tables in tests/docs/test_prose.py."""
    said(
        text,
        r"Two simulated nodes barely beat one \([\d.]+× in this recording\), four are slower "
        r"than one \([\d.]+×\)\. The recording was taken while other work shared the same two "
        r"cores, so your numbers will differ \(Lab 2's quieter run of 2 processes reached "
        r"[\d.]+×\) — but not the shape: never beyond 2×, and lower at 4 than at 2\.",
    )
    lab3 = speedups("lab3/scaling.json")
    assert 1 < lab3[2] < 1.2, "barely beat one"
    assert lab3[4] < 1, "four are slower than one"
    assert speedups("lab2/world_sizes.json")[2] > lab3[2], "quieter: a higher speed-up"
    assert max(lab3.values()) < 2 and lab3[4] < lab3[2], "the shape"
    batch, steps = said(
        text, r"one process per node, the same global batch of (\d+), (\d+) steps, recorded by"
    )
    data = json.loads((GENERATED / "lab3" / "scaling.json").read_text())
    assert {(r["global_batch_size"], r["steps"]) for r in data["runs"].values()} == {
        (int(batch), int(steps))
    }


def check_barrier(text: str) -> None:
    (later,) = said(
        text,
        r"Four ranks, recorded by `python tools/figures_lab3\.py barrier`, each ([\d.]+) s later",
    )
    (timeout,) = said(text, r"`python tools/figures_lab3\.py barrier`, with a (\d+) s timeout:")
    assert (
        f"Timed out waiting {int(timeout) * 1000}ms"
        in (GENERATED / "lab3" / "barrier_timeout.txt").read_text()
    )
    said(text, r"Everyone leaves together — within a few milliseconds of the last arrival")
    said(text, r"the early ranks' wait is exactly how late the last one was")
    rows = json.loads((GENERATED / "lab3" / "barrier.json").read_text())
    last = max(r["arrived"] for r in rows)
    assert all(0 <= r["released"] - last < 0.01 for r in rows), "a few milliseconds"
    first = min(rows, key=lambda r: r["delay"])
    late = max(r["delay"] for r in rows) - first["delay"]
    assert round(first["released"] - first["arrived"], 2) == late
    delays = sorted(r["delay"] for r in rows)
    assert len(rows) == 4 and delays == [k * float(later) for k in range(4)]


def check_barrier_slack(text: str) -> None:
    """The slack the page explains is the one its compared two-rank block allows."""
    (slack,) = said(text, r"\(([\d.]+) s: the first barrier that lines the ranks up releases them")
    (in_code,) = said(text, r'early\["arrived"\] >= 1\.0 - ([\d.]+)\)')
    assert float(slack) == float(in_code)


def check_gradient_bytes(text: str) -> None:
    (megabytes,) = said(text, r"The gradients \(([\d.]+) MB\) go over 127\.0\.0\.1")
    params = sum(p.numel() for p in TinyTransformer(load_model_config()).parameters())
    assert float(megabytes) == round(params * 4 / 1e6, 1)


@pytest.mark.parametrize(
    "check", [check_scaling, check_barrier, check_barrier_slack, check_gradient_bytes]
)
def test_the_pages_numbers_are_those_of_the_recorded_runs(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_scaling, "global batch of 32, 30 steps", "global batch of 32, 40 steps"),
        (check_barrier, "each 0.5 s later", "each 1.0 s later"),
        (check_barrier, "with a 3 s timeout", "with a 5 s timeout"),
        (check_barrier_slack, "(0.05 s: the first", "(0.5 s: the first"),
        (check_gradient_bytes, "(0.7 MB)", "(2.7 MB)"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
