"""Numbers in the prose of "Evaluation" (docs/workflows/evaluation.md) that no output block
shows. tests/scripts/test_evaluate.py compares the losses the page quotes with its recorded
runs; this module checks the rest:

- the tolerances the page states, against the constants of the tests that enforce them
  (tests/tinyscale/workflows/test_evaluation.py: the shares add up;
  tests/scripts/test_evaluate.py: two processes against one, the other writers);
- the steps the page's runs and the tests' runs take, against their commands and constants;
- the held-out tenth, the sample's length and an untrained model's perplexity, against the
  code and the recorded step 0.
"""

from __future__ import annotations

import ast
import inspect
import math
import re

import pytest

from helpers import ROOT, fails_when_changed, prose, recorded_output, said
from tinyscale.core.config import load_model_config
from tinyscale.core.data import build_datasets
from tinyscale.workflows.evaluation import SampleConfig

PAGE = "workflows/evaluation.md"
SCRIPT_TESTS = "tests/scripts/test_evaluate.py"
SUPERSCRIPT = str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789")


def power(exponent: str) -> float:
    """10⁻⁶ as the page writes it (the exponent's superscript digits) -> 1e-06."""
    return 10.0 ** -int(exponent.translate(SUPERSCRIPT))


UNIT_TESTS = "tests/tinyscale/workflows/test_evaluation.py"


def constant_in(path: str, name: str) -> object:
    """The value a test file assigns to the module constant ``name`` (read, not imported:
    the test module's imports stay out of this one)."""
    tree = ast.parse((ROOT / path).read_text())
    (value,) = [
        ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == name for t in n.targets)
    ]
    return value


def script_steps() -> int:
    """STEPS, BATCH = 2, "32" in tests/scripts/test_evaluate.py: the steps each writer takes."""
    tree = ast.parse((ROOT / SCRIPT_TESTS).read_text())
    (steps,) = [
        ast.literal_eval(n.value.elts[0])
        for n in tree.body
        if isinstance(n, ast.Assign)
        and isinstance(n.targets[0], ast.Tuple)
        and n.targets[0].elts[0].id == "STEPS"
    ]
    return steps


def approx_abs_in(path: str, function: str) -> list[float]:
    """The ``abs=`` tolerances that ``function`` of the test file ``path`` passes to
    ``pytest.approx``, a literal or a module constant."""
    tree = ast.parse((ROOT / path).read_text())
    (found,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    return [
        constant_in(path, k.value.id)
        if isinstance(k.value, ast.Name)
        else ast.literal_eval(k.value)
        for call in ast.walk(found)
        if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "approx"
        for k in call.keywords
        if k.arg == "abs"
    ]


def check_tolerances(text: str) -> None:
    (shares,) = said(
        text, r"so the result agrees up to rounding: the tests require the two within "
        r"10⁻([⁰¹²³⁴⁵⁶⁷⁸⁹]+)\.",
    )  # fmt: skip
    sharded = approx_abs_in(SCRIPT_TESTS, "test_sharded_evaluation_equals_one_process")
    assert power(shares) == constant_in(UNIT_TESTS, "SHARES_TOLERANCE")
    assert sharded == [power(shares)]
    (two,) = said(text, r"The test suite requires them to agree within 10⁻([⁰¹²³⁴⁵⁶⁷⁸⁹]+), not")
    assert sharded == [power(two)]
    steps, writers = said(
        text,
        r"on two ranks each train the same model (\d+) steps on the same batches \(dropout 0, "
        r"fp32\)\. The evaluation scores their four checkpoints within 10⁻([⁰¹²³⁴⁵⁶⁷⁸⁹]+) of "
        r"Lab 1's own last held-out loss",
    )
    assert power(writers) == constant_in(SCRIPT_TESTS, "OTHER_WRITERS")
    assert int(steps) == script_steps()


def check_steps(text: str) -> None:
    (test_steps,) = said(
        text, r"The test suite runs Lab 1 for (\d+) steps and requires the two to be equal bit"
    )
    assert int(test_steps) == script_steps()
    steps, every = said(
        text, r"First a checkpoint of Lab 1: (\d+) steps, scored on the held-out set every (\d+)\."
    )
    assert said(
        text, r"train_tiny_transformer\.py --max-steps (\d+) --eval-every (\d+) --output-dir "
        r"runs/evaluation/lab1 ",
    ) == (steps, every)  # fmt: skip
    (buy,) = said(text, r"The text itself is what (\d+) steps buy")
    (old,) = said(text, r"A model (\d+) steps old puts the most weight")
    assert buy == old == steps
    (pipeline,) = said(text, r"two\s+processes, (\d+) steps\. Each rank saves its own stage")
    assert said(text, r"pipeline_train\.py --max-steps (\d+) --log-every") == (pipeline,)
    assert said(
        text, r"the pipeline's weights after (\d+) steps are not Lab 1's after (\d+) steps"
    ) == (pipeline, pipeline)  # fmt: skip


def check_data_and_sample(text: str) -> None:
    (percent,) = said(text, r"\(the last (\d+) % of the token stream, `build_datasets")
    default = inspect.signature(build_datasets).parameters["heldout_fraction"].default
    assert int(percent) == round(100 * default)
    vocab, about = said(text, r"An untrained model over ([\d,]+) tokens scores about ([\d,]+)\.")
    assert int(vocab.replace(",", "")) == load_model_config().vocab_size
    assert about == vocab  # a uniform guess over V tokens: perplexity V
    lines = recorded_output(PAGE, "train_tiny_transformer.py --max-steps 40")
    step0 = float(re.search(r"step +0/\d+ .* perplexity +([\d.]+)", lines[1])[1])
    assert abs(math.log(step0 / int(about.replace(",", "")))) < 0.05, "about: within 5 %"
    (tokens,) = said(text, r"Draw (\d+) tokens from the Lab 1 checkpoint three ways")
    assert int(tokens) == SampleConfig().max_new_tokens


@pytest.mark.parametrize("check", [check_tolerances, check_steps, check_data_and_sample])
def test_the_pages_numbers_are_the_tests_and_the_code(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_tolerances, "require the two within 10⁻⁶", "require the two within 10⁻⁸"),
        (check_tolerances, "agree within 10⁻⁶, not", "agree within 10⁻⁵, not"),
        (check_tolerances, "checkpoints within 10⁻⁶", "checkpoints within 10⁻⁷"),
        (check_tolerances, "same model 2 steps", "same model 4 steps"),
        (check_steps, "runs Lab 1 for 2 steps", "runs Lab 1 for 3 steps"),
        (check_steps, "what 40 steps buy", "what 60 steps buy"),
        (check_steps, "after 8 steps are not", "after 6 steps are not"),
        (check_data_and_sample, "the last 10 % of", "the last 5 % of"),
        (check_data_and_sample, "scores about 1,024", "scores about 2,048"),
        (check_data_and_sample, "Draw 40 tokens", "Draw 50 tokens"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
