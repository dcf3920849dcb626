"""tinyscale.core.config: the shipped config loads, and every bad input is a one-line UsageError.

Each error must name the fix (a "did you mean" for a near-miss key, a divisor for a head
count that does not divide hidden_size, the flag to pass for a missing file).
"""

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import ROOT
from tinyscale.core.config import (
    DEFAULT_CONFIG_PATH,
    PRESETS,
    ModelConfig,
    load_model_config,
    preset,
)
from tinyscale.core.errors import UsageError
from tinyscale.core.model import TinyTransformer

SHIPPED = ROOT / "code" / "config" / "config.json"


def write_config(tmp_path: Path, **overrides: Any) -> Path:
    """The shipped config with some fields changed (or added), written to a temp file."""
    raw = json.loads(SHIPPED.read_text())
    raw.update(overrides)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    return path


def usage_error(path: Path) -> str:
    """Load ``path``, expect a UsageError, check it is one line, and return its message."""
    with pytest.raises(UsageError) as info:
        load_model_config(path)
    message = str(info.value)
    assert message and "\n" not in message, f"not one line: {message!r}"
    return message


def test_shipped_config_loads() -> None:
    cfg = load_model_config(SHIPPED)
    raw = json.loads(SHIPPED.read_text())
    # every field in the file; the one it leaves out keeps its default (today's tied model)
    assert dataclasses.asdict(cfg) == raw | {"tie_word_embeddings": True}
    assert cfg.head_dim * cfg.num_attention_heads == cfg.hidden_size
    assert (ROOT / DEFAULT_CONFIG_PATH).resolve() == SHIPPED.resolve()


def test_hidden_size_not_divisible_by_heads(tmp_path: Path) -> None:
    message = usage_error(write_config(tmp_path, hidden_size=64, num_attention_heads=5))
    assert "not divisible" in message and "num_attention_heads" in message
    # the fix: head counts that do divide 64, including the nearest one to 5
    suggested = [int(n) for n in re.findall(r"\d+", message.split("e.g.")[-1])]
    assert suggested and all(64 % n == 0 for n in suggested) and 4 in suggested


def test_missing_file(tmp_path: Path) -> None:
    message = usage_error(tmp_path / "nope.json")
    assert "not found" in message and "--config" in message


def test_malformed_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 64,}')
    message = usage_error(path)
    assert "not valid JSON" in message and "line 1" in message


def test_json_array_instead_of_object(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("[64, 2, 4]")
    message = usage_error(path)
    assert "JSON object" in message and "list" in message


def test_unknown_key_suggests_the_near_miss(tmp_path: Path) -> None:
    raw = json.loads(SHIPPED.read_text())
    raw["hidden_sise"] = raw.pop("hidden_size")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    message = usage_error(path)
    assert "'hidden_sise'" in message and "did you mean 'hidden_size'?" in message


def test_unknown_key_far_from_any_lists_valid_keys(tmp_path: Path) -> None:
    message = usage_error(write_config(tmp_path, colour="blue"))
    assert "'colour'" in message
    for field in dataclasses.fields(ModelConfig):
        assert field.name in message


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("hidden_size", "64", "whole number"),
        ("num_hidden_layers", True, "whole number"),
        ("num_attention_heads", 4.0, "whole number"),
        ("vocab_size", None, "whole number"),
        ("dropout", "0.1", "number"),
        ("dropout", False, "number"),
        ("layer_norm_eps", "1e-5", "number"),
        ("tie_word_embeddings", 1, "true or false"),
        ("tie_word_embeddings", "false", "true or false"),
        ("tie_word_embeddings", None, "true or false"),
    ],
)
def test_wrong_types(tmp_path: Path, field: str, value: object, expected: str) -> None:
    message = usage_error(write_config(tmp_path, **{field: value}))
    assert field in message and expected in message


@pytest.mark.parametrize(
    "field",
    [
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
        "layer_norm_eps",
    ],
)
@pytest.mark.parametrize("value", [0, -3])
def test_non_positive_values(tmp_path: Path, field: str, value: int) -> None:
    message = usage_error(write_config(tmp_path, **{field: value}))
    assert field in message and "positive" in message


@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5])
def test_dropout_out_of_range(tmp_path: Path, value: float) -> None:
    message = usage_error(write_config(tmp_path, dropout=value))
    assert "dropout" in message and "[0, 1)" in message


def test_dropout_zero_is_allowed(tmp_path: Path) -> None:
    assert load_model_config(write_config(tmp_path, dropout=0)).dropout == 0


def test_vocab_smaller_than_the_byte_alphabet(tmp_path: Path) -> None:
    message = usage_error(write_config(tmp_path, vocab_size=100))
    assert "vocab_size" in message and "260" in message


@pytest.mark.parametrize("literal", ["NaN", "Infinity"])
def test_non_finite_layer_norm_eps(tmp_path: Path, literal: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        SHIPPED.read_text().replace('"layer_norm_eps": 1e-05', f'"layer_norm_eps": {literal}')
    )
    assert literal in path.read_text()
    usage_error(path)


def test_model_config_direct_construction_checks_too() -> None:
    with pytest.raises(UsageError, match="not divisible"):
        ModelConfig(hidden_size=30, num_attention_heads=4)


@pytest.mark.parametrize("tie", [True, False])
def test_tie_word_embeddings_is_read_from_json(tmp_path: Path, tie: bool) -> None:
    path = write_config(tmp_path, tie_word_embeddings=tie)
    assert f'"tie_word_embeddings": {str(tie).lower()}' in path.read_text()  # a JSON boolean
    assert load_model_config(path).tie_word_embeddings is tie


def test_tie_word_embeddings_near_miss(tmp_path: Path) -> None:
    message = usage_error(write_config(tmp_path, tie_word_embedding=False))
    assert "did you mean 'tie_word_embeddings'?" in message


def test_the_lab_preset_is_the_shipped_config() -> None:
    assert preset("lab") == load_model_config(ROOT / "code" / "config" / "config.json")


def test_presets_build_and_take_changes() -> None:
    for name in PRESETS:
        with torch.device("meta"):  # shapes only: the 70b preset would need 260 GB of weights
            TinyTransformer(preset(name))  # every preset is a valid model
    assert preset("tiny", num_hidden_layers=6).num_hidden_layers == 6
    assert PRESETS["tiny"].num_hidden_layers == 2  # the named shape itself is unchanged
    with pytest.raises(UsageError) as info:
        preset("huge")
    assert "\n" not in str(info.value) and "tiny" in str(info.value)


def test_the_default_config_is_found_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no code/config/config.json below here
    assert load_model_config() == preset("lab")
