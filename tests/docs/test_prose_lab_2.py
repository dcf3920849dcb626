"""Lab 2's run-derived numbers, read from the page and compared with the data (numbers in
prose come from data):

- the world-size runs (docs/generated/lab2/world_sizes.json, `python tools/figures_lab2.py
  world_sizes`): their steps, how close their final losses are, the speed-up of 2 processes;
- the tolerance the page states for accumulation with dropout 0, against the one its
  compared code block uses;
- the bytes of the gradients DDP all-reduces: the Lab config's parameters in fp32;
- torch's default process-group timeouts, from `torch.distributed.constants`;
- the training set of the last-batch exercise: the blocks of Lab 1's recorded run.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
import torch.distributed.constants as pg

from helpers import ROOT, fails_when_changed, prose, said
from tinyscale.core.config import load_model_config
from tinyscale.core.model import TinyTransformer

PAGE = "workshop/lab-2.md"
GENERATED = ROOT / "docs" / "generated"


def runs() -> dict[int, dict]:
    data = json.loads((GENERATED / "lab2" / "world_sizes.json").read_text())["runs"]
    return {int(n): run for n, run in data.items()}


def check_world_sizes(text: str) -> None:
    (steps,) = said(text, r"\(the same (\d+) steps on 1, 2 and 4 processes, every step logged\)")
    assert {run["steps"] for run in runs().values()} == {int(steps)}
    bound, low, high = said(
        text,
        r"The final global losses of 1, 2 and 4 processes differ by less than ([\d.]+) "
        r"\(([\d.]+) to ([\d.]+) in the runs above\)",
    )
    finals = [run["final_loss"] for run in runs().values()]
    assert (float(low), float(high)) == (round(min(finals), 4), round(max(finals), 4))
    assert max(finals) - min(finals) < float(bound)
    speedup, ideal = said(
        text, r"the total grows \(([\d.]+)× one process's, not (\d)×: each step also waits"
    )
    tokens = {n: run["tokens_per_second"] for n, run in runs().items()}
    assert float(speedup) == round(tokens[2] / tokens[1], 1)
    assert int(ideal) == 2


def check_tolerance(text: str) -> None:
    """Both sentences state the tolerance the compared block of step 4 checks."""
    (in_list,) = said(text, r"with dropout 0 they agree within ([\d.e-]+) at every logged step")
    (in_step,) = said(
        text, r"the loss over the whole batch \(the logs' `global loss`, within ([\d.e-]+)\)"
    )
    (in_code,) = said(text, r"abs\(float\(x\) - float\(y\)\) <= ([\d.e-]+) for")
    assert float(in_list) == float(in_step) == float(in_code)


def check_gradient_bytes(text: str) -> None:
    (megabytes,) = said(text, r"the all-reduce of this model's ([\d.]+) MB of gradients")
    params = sum(p.numel() for p in TinyTransformer(load_model_config()).parameters())
    assert float(megabytes) == round(params * 4 / 1e6, 1)


def check_timeouts(text: str) -> None:
    gloo, nccl = said(
        text,
        r"Without `timeout=`, torch waits (\d+) minutes on gloo and (\d+) on NCCL "
        r"\(`torch\.distributed\.constants`\)",
    )
    assert pg.default_pg_timeout == timedelta(minutes=int(gloo))
    assert pg.default_pg_nccl_timeout == timedelta(minutes=int(nccl))


def check_last_batch(text: str) -> None:
    (blocks,) = said(text, r"The training set has ([\d,]+) samples\. With 2 ranks")
    header = (GENERATED / "lab1" / "train.txt").read_text().splitlines()[0]
    recorded = re.search(r"([\d,]+) training blocks", header)[1]
    assert blocks == recorded, "Lab 1's recorded run, the same data"
    before, after, each = said(
        text, r"`drop_last=True` trims ([\d,]+) to ([\d,]+) so both ranks get ([\d,]+);"
    )
    n = int(before.replace(",", ""))
    assert before == blocks
    assert int(after.replace(",", "")) == n - n % 2 == 2 * int(each.replace(",", ""))


CHECKS = [
    check_world_sizes,
    check_tolerance,
    check_gradient_bytes,
    check_timeouts,
    check_last_batch,
]


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_those_of_the_data(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_world_sizes, "differ by less than 0.005", "differ by less than 0.002"),
        (check_world_sizes, "grows (1.5× one", "grows (1.9× one"),
        (check_tolerance, "agree within 2e-4 at", "agree within 1e-4 at"),
        (check_gradient_bytes, "model's 0.7 MB of", "model's 2.7 MB of"),
        (check_timeouts, "waits 30 minutes on gloo", "waits 20 minutes on gloo"),
        (check_last_batch, "trims 3,319 to 3,318", "trims 3,319 to 3,316"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
