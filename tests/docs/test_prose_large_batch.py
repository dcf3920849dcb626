"""The large-batch page's words about its two runs are true of the runs' outputs.

Both `python -m tinyscale.ops.large_batch` outputs on the page are compared with a fresh
run by CI; what the page says of them in its own words is read here and checked against
those tables (steps, held-out losses, learning rates) and the scaling rules of
tinyscale.ops.large_batch.
"""

from __future__ import annotations

import re

import pytest

from helpers import fails_when_changed, prose, said
from tinyscale.ops.large_batch import linear_lr, sqrt_lr

PAGE = "operations/large-batch.md"
TIMES = {"twice": 2, "Four times": 4, "four times": 4}
ROW = r"B=(\d+), (.+?) (\d+) (\d+\.\d+)(?= B=|$)"


def tables(text: str) -> list[dict[str, tuple[int, int, float, float | None]]]:
    """The page's two outputs (compared by CI): recipe -> (batch, steps, loss, lr)."""
    found = []
    for block in text.split("every run sees the same")[1:]:
        block = block.split("gradient noise scale")[0]
        rows = {}
        for batch, label, steps, loss in re.findall(ROW, block.strip()):
            lr = re.search(r"lr ([\d.]+)", label)
            name = "base" if label.startswith("lr") else re.sub(r" lr [\d.]+", "", label)
            rows[name] = (int(batch), int(steps), float(loss), float(lr[1]) if lr else None)
        found.append(rows)
    assert len(found) == 2 and all(len(rows) == 5 for rows in found), found
    return found


def check_first_run(text: str) -> None:
    rows = tables(text)[0]
    base, same, linear = rows["base"], rows["same lr"], rows["linear, no warmup"]
    k, worse, better, fewer = said(
        text,
        r"Same learning rate, (\d)× the batch: clearly worse\*\* \(([\d.]+) against "
        r"([\d.]+)\)\. (Four times) fewer steps of the same size cover less ground",
    )
    assert int(k) == same[0] // base[0] == TIMES[fewer] == base[1] // same[1]
    assert (float(worse), float(better)) == (same[2], base[2]) and same[2] > base[2]
    loss, steps, batch, factor, within, base_steps, base_batch, fewer, wall = said(
        text,
        r"The linear rule recovers almost all of it\*\* \(([\d.]+)\): (\d+) steps of batch "
        r"(\d+) at (\d)× the learning rate end within ([\d.]+) of (\d+) steps of batch (\d+)\. "
        r"(Four times) fewer steps for the same data — on GPUs, up to (four times) less wall "
        r"time\.",
    )
    assert float(loss) == linear[2] and (int(steps), int(batch)) == linear[1::-1]
    assert (int(base_steps), int(base_batch)) == base[1::-1]
    assert linear[3] == pytest.approx(
        linear_lr(base_lr=base[3], base_batch=base[0], batch=linear[0])
    )
    assert linear[3] / base[3] == pytest.approx(int(factor))
    assert abs(linear[2] - base[2]) <= float(within)
    assert TIMES[fewer] == TIMES[wall] == base[1] // linear[1]


def check_cluster_lr(text: str) -> None:
    nodes, k, doubles = said(
        text,
        r"Going from 1 node to (\d) at a fixed micro-batch multiplies it by (\d); with AdamW, "
        r"the square-root rule (doubles) the learning rate",
    )
    runs = re.findall(r"--global-batch-size (\d+) --lr ([\de.-]+)", text)
    (small, lr), (big, big_lr) = ((int(b), float(r)) for b, r in runs)
    assert int(nodes) == int(k) == big // small
    assert sqrt_lr(base_lr=lr, base_batch=small, batch=big) == pytest.approx(big_lr)
    assert doubles == "doubles" and big_lr / lr == pytest.approx(2)


def check_exercise_lr(text: str) -> None:
    batch, lr, gpus, more = said(
        text,
        r"A run was tuned at a global batch of (\d+) with AdamW at lr ([\de.-]+)\. It moves "
        r"from (\d+) to (\d+) GPUs",
    )
    (start,) = said(text, r"start from the square-root value, ([\d.]+e-\d+), with a warmup")
    big = int(batch) * int(more) // int(gpus)
    value = sqrt_lr(base_lr=float(lr), base_batch=int(batch), batch=big)
    assert float(start) == float(f"{value:.1e}")


def check_critical_batch(text: str) -> None:
    first, second = tables(text)
    k, twice, k_before = said(text, r"k = (\d+), (twice) the run above's k = (\d+)\.")
    assert int(k) == second["same lr"][0] // second["base"][0]
    assert int(k_before) == first["same lr"][0] // first["base"][0]
    assert int(k) == TIMES[twice] * int(k_before)
    near, half, steps, batch = said(
        text,
        r"every batch-32 recipe ends near ([\d.]+), (almost half) a nat behind (\d+) steps of "
        r"batch (\d+)",
    )
    base = second["base"]
    assert (int(steps), int(batch)) == base[1::-1]
    losses = [row[2] for name, row in second.items() if name != "base"]
    assert all(abs(loss - float(near)) < 0.02 for loss in losses), "near"
    assert half == "almost half" and all(0.4 <= loss - base[2] < 0.5 for loss in losses)


CHECKS = [check_first_run, check_cluster_lr, check_exercise_lr, check_critical_batch]


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_words_are_true_of_its_runs(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_first_run, "end within 0.03 of", "end within 0.02 of"),
        (check_exercise_lr, "square-root value, 8.5e-4,", "square-root value, 8.5e-3,"),
        (check_critical_batch, "k = 8, twice", "k = 16, twice"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
