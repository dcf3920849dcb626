"""The Accelerate page's numbers in prose are those of its runs and of the script's tests.

- step 1's run: the steps and the evaluation interval the text gives are the command's;
- the recorded full run (docs/generated/accelerate/, tools/figures_accelerate.py): its final
  held-out loss and Lab 1's (docs/generated/lab1/), rounded as the page rounds, a gap far
  above the kernels' last digits, and two processes not twice as fast as one;
- the proof: the settings, steps and tolerances the page states are those of
  tests/scripts/test_accelerate_train.py.
"""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType

import pytest

from helpers import ROOT, fails_when_changed, prose, said
from tinyscale.core.metrics import read_metrics

PAGE = "workshop/accelerate.md"
GENERATED = ROOT / "docs" / "generated"
# How far the held-out loss moved when only the CPU kernels changed: 0.004 at most (step
# 150), AVX2 against AVX-512 on the recording machine. The gap the page calls "far larger"
# is at least five times that.
KERNEL_NOISE = 0.004


def script_test() -> ModuleType:
    """tests/scripts/test_accelerate_train.py, for its constants (settings, tolerances)."""
    path = ROOT / "tests" / "scripts" / "test_accelerate_train.py"
    spec = importlib.util.spec_from_file_location("prose_accelerate_train_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def final_heldout(path: str) -> float:
    records = read_metrics(GENERATED / path)
    return [r for r in records if r["split"] == "heldout"][-1]["loss"]


def tokens_per_second(path: str) -> float:
    (rate,) = re.findall(r"done: .*?\(([\d,]+) tokens/s", (GENERATED / path).read_text())
    return float(rate.replace(",", ""))


def check_short_run(text: str) -> None:
    steps, every = said(
        text,
        r"Two CPU processes train Lab 1's model for (\d+) steps, and the main process "
        r"evaluates on held-out data every (\d+) steps",
    )
    flags = said(
        text, r"--cpu --max-steps (\d+) --eval-every (\d+) --output-dir runs/accelerate-cpu"
    )
    assert (steps, every) == flags
    (logged,) = said(text, r"(\d+) steps on each process, 0 of them on the same blocks")
    assert logged == steps


def check_final_loss(text: str) -> None:
    mine, lab1 = said(
        text,
        r"In this recording the held-out loss ends at ([\d.]+), close to Lab 1's ([\d.]+) but "
        r"not equal, and the gap is far larger than the kernels' last digits",
    )
    accelerate, single = (
        final_heldout("accelerate/metrics.jsonl"),
        final_heldout("lab1/metrics.jsonl"),
    )
    assert round(accelerate, 2) == float(mine) and round(single, 2) == float(lab1)
    assert 5 * KERNEL_NOISE <= abs(accelerate - single) < 0.2, "close, not equal, far larger"


def check_speed(text: str) -> None:
    said(text, r"Two processes on two cores are not twice as fast as Lab 1's one process")
    ratio = tokens_per_second("accelerate/train.txt") / tokens_per_second("lab1/train.txt")
    assert ratio < 2, ratio


def check_proof(text: str) -> None:
    module = script_test()
    (quoted,) = said(text, r"With dropout 0 the two runs agree step for step to ([\de.-]+) —")
    processes, accum, micro = said(
        text,
        r"launches the script on (\d+) processes with `--grad-accum-steps (\d+)` "
        r"\(micro-batches of (\d+) blocks\) and dropout 0",
    )
    loss, steps, weights = said(
        text,
        r"\(within ([\de.-]+) nats: only the order of float additions differs\) and the same "
        r"weights after (\d+) steps \(within ([\de.-]+)\)",
    )
    assert float(quoted) == float(loss) == module.LOSS_TOLERANCE
    assert float(weights) == module.WEIGHT_TOLERANCE and int(steps) == module.STEPS
    assert (int(processes), int(accum), int(micro)) == (
        module.PROCESSES,
        module.ACCUM,
        module.MICRO,
    )


CHECKS = [check_short_run, check_final_loss, check_speed, check_proof]


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_those_of_the_runs_and_tests(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_short_run, "model for 20 steps, and", "model for 30 steps, and"),
        (check_final_loss, "loss ends at 5.11, close", "loss ends at 5.12, close"),
        (
            check_proof,
            "weights after 20 steps (within 1e-4)",
            "weights after 20 steps (within 1e-3)",
        ),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
