"""tinyscale.low_precision.compare: bad input is one line, before any training. (Its
training runs are checked against the recorded curves in tests/docs/test_generated_week3_fp8.py.)"""

from helpers import one_line_error
from tinyscale.low_precision.compare import main


def test_an_unknown_variant_is_refused_before_anything_runs(capsys) -> None:
    message = one_line_error(main, ["--variants", "fp32", "fp4"])
    assert message.startswith("unknown variant 'fp4': use one of fp32, bf16, fp8-tensorwise")
    assert capsys.readouterr().out == ""  # refused before the first run, not after it


def test_steps_outside_one_epoch_are_one_line_before_any_output(capsys) -> None:
    message = one_line_error(main, ["--steps", "500", "--variants", "fp32"])
    assert message == "--steps 500: one epoch holds 207 steps; use 1 to 207"
    assert one_line_error(main, ["--steps", "0"]).startswith("--steps 0: one epoch holds")
    assert one_line_error(main, ["--eval-every", "0"]) == "--eval-every 0: use 1 or more"
    assert capsys.readouterr().out == ""
