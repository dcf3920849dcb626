"""One script, any shape: the numbers in its prose are those of its runs and configs.

- the vocabularies: torchtitan's llama3 (128k) against the Lab model's;
- rank 0's share of the parameters on FSDP 2 × TP 2, from the recorded log (a CI-compared
  output): about a quarter, not exactly, and Exercise 4, which counts why, says a quarter
  for what TP and FSDP both cut and a half for what only FSDP cuts, as its code does.

The halves of the shape table are the flags' values (tests/docs/prose_rules/week_4.py).
"""

from __future__ import annotations

import re

import pytest

from helpers import fails_when_changed, prose, recorded_output, said
from tinyscale.core.config import load_model_config

PAGE = "week-4/train-any-shape.md"
SHARE = {"a quarter": 4, "a half": 2, "about a quarter": 4}


def number(text: str) -> int:
    return int(text.replace(",", ""))


def check_vocabularies(text: str) -> None:
    theirs, ours = said(
        text,
        r"with llama3's (\d+)k vocabulary that saves memory\. With our ([\d,]+) tokens, the "
        r"simple way costs nothing",
    )
    assert number(ours) == load_model_config().vocab_size
    pytest.importorskip("torchtitan", reason="torchtitan is in the cluster extra: make setup")
    from torchtitan.models.llama3 import model_registry

    for size in ("8B", "70B"):
        assert round(model_registry(size).model.vocab_size, -3) == int(theirs) * 1000


def check_rank_share(text: str) -> None:
    held, whole, about, exercise = said(
        text,
        r"rank 0 holds ([\d,]+) of the ([\d,]+) parameters: (about a quarter) \(exercise (\d) "
        r"says why not exactly\)",
    )
    log = "\n".join(recorded_output(PAGE, "--fsdp 2 --tp 2 --dropout 0 --max-steps 2"))
    found = re.search(r"this rank holds ([\d,]+) of its stage's ([\d,]+) parameters", log)
    assert found and (number(found[1]), number(found[2])) == (number(held), number(whole))
    share = number(held) / number(whole)
    assert round(share * SHARE[about]) == 1 and share != 1 / SHARE[about]
    said(text, rf"{exercise}\. \*\*Where did the parameters go\?\*\* On FSDP 2 × TP 2, rank 0")
    quarter, exact = said(text, r"Why not exactly (a quarter), ([\d,]+)\?")
    assert number(whole) == SHARE[quarter] * number(exact)


def check_exercise_4(text: str) -> None:
    by_tp_and_fsdp, by_fsdp = said(
        text,
        r"then by FSDP: (a quarter) each\. Some tensors are whole on every TP rank and cut only "
        r"by FSDP, (a half) each",
    )
    said(text, rf"print\(by_four // {SHARE[by_tp_and_fsdp]} \+ by_two // {SHARE[by_fsdp]}\)")
    (counted,) = recorded_output(PAGE, "print(by_four // 4 + by_two // 2)")
    log = "\n".join(recorded_output(PAGE, "--fsdp 2 --tp 2 --dropout 0 --max-steps 2"))
    assert f"this rank holds {int(counted):,} of" in log


@pytest.mark.parametrize("check", [check_vocabularies, check_rank_share, check_exercise_4])
def test_the_pages_numbers_are_those_of_the_data(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_vocabularies, "With our 1,024 tokens", "With our 2,048 tokens"),
        (check_rank_share, "(exercise 4 says why", "(exercise 3 says why"),
        (check_rank_share, "a quarter, 42,432?", "a quarter, 42,000?"),
        (check_exercise_4, "FSDP, a half each", "FSDP, a quarter each"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
