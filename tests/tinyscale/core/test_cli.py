"""tinyscale.core.cli: flags built from TrainConfig's fields, parsed back into a checked config.

The four training scripts build their flags this way; here the builder itself is tested on
TrainConfig, with a script's own defaults, and on the errors it must turn into one line.
"""

import argparse
import dataclasses

import pytest

from tinyscale.core.cli import add_flags, flag, from_args
from tinyscale.core.errors import ArgumentParser, UsageError
from tinyscale.core.training import TrainConfig

LAB2 = TrainConfig(epochs=1, global_batch_size=32, output_dir="runs/ddp")


def parse(defaults: TrainConfig, names: tuple[str, ...], argv: list[str]) -> TrainConfig:
    parser = ArgumentParser()
    add_flags(parser, defaults, names)
    return from_args(defaults, parser.parse_args(argv))


def test_every_field_has_help_and_a_flag() -> None:
    for field in dataclasses.fields(TrainConfig):
        assert field.metadata["help"], field.name
    assert flag("global_batch_size") == "--global-batch-size"


def test_flags_take_a_scripts_defaults_and_types() -> None:
    names = ("epochs", "global_batch_size", "lr", "max_steps", "output_dir")
    cfg = parse(LAB2, names, [])
    assert cfg == LAB2  # no flag given: the script's defaults, not TrainConfig's
    cfg = parse(LAB2, names, ["--epochs", "3", "--lr", "0.01", "--max-steps", "7"])
    assert (cfg.epochs, cfg.lr, cfg.max_steps, cfg.output_dir) == (3, 0.01, 7, "runs/ddp")
    assert isinstance(cfg.lr, float) and isinstance(cfg.max_steps, int)


def test_a_field_without_a_flag_keeps_the_default() -> None:
    cfg = parse(LAB2, ("epochs",), ["--epochs", "2"])
    assert cfg.global_batch_size == 32 and cfg.epochs == 2
    with pytest.raises(UsageError, match="unrecognized arguments: --lr"):
        parse(LAB2, ("epochs",), ["--lr", "1"])


def test_a_bool_field_is_a_switch_that_turns_it_off() -> None:
    assert parse(LAB2, ("progress",), []).progress is None  # None: tqdm decides
    assert parse(LAB2, ("progress",), ["--no-progress"]).progress is False


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--epochs", "two"], "argument --epochs: invalid int value: 'two'"),
        (["--epochs", "0"], "--epochs must be a positive number, got 0"),
        (["--lr", "nan"], "--lr must be a positive number, got nan"),
    ],
)
def test_bad_values_end_in_one_line_that_names_the_flag(argv: list[str], words: str) -> None:
    with pytest.raises(UsageError) as info:
        parse(LAB2, ("epochs", "lr"), argv)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_notes_add_a_scripts_words_to_the_help() -> None:
    parser = argparse.ArgumentParser()
    add_flags(
        parser, TrainConfig(precision=None), ("precision",), notes={"precision": "the JSON's"}
    )
    help_text = parser.format_help()
    assert "fp32, bf16 or fp16" in help_text and "the JSON's" in help_text
