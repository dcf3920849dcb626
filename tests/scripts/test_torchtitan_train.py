"""torchtitan's debug model on CPU (code/scripts/torchtitan_train.py, tinyscale.titan_config).

The training run is the torchtitan page's code block: CI runs it (2 gloo ranks, FSDP)
and compares its output with the recorded text. These tests check that recorded text —
FSDP over 2 ranks, 6 steps, a loss that falls — and the config function itself.
"""

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is in the cluster extra: make setup")

from tinyscale.titan_config import VOCAB_SIZE, prepare_assets, tinyscale_debug

PAGE = Path(__file__).parents[2] / "docs" / "week-2" / "torchtitan.md"


def recorded() -> str:
    text = PAGE.read_text()
    start = text.index("--module tinyscale.titan_config --config tinyscale_debug 2>&1")
    return re.search(r"```text\n(.*?)```", text[start:], re.S).group(1)


def test_recorded_run_is_fsdp_over_two_ranks() -> None:
    out = recorded()
    assert "dp_replicate=1, dp_shard=2, cp=1, tp=1" in out
    assert "Applied FSDP to the model" in out


def test_recorded_loss_falls_over_six_steps() -> None:
    losses = [float(v) for v in re.findall(r"step: +\d+ +loss: +([\d.]+)", recorded())]
    assert len(losses) == 6
    assert losses[-1] < losses[0] - 0.5
    assert "Saving a full checkpoint at last step, step 6." in recorded()


def test_config_function_points_at_our_assets_and_sizes_for_a_laptop() -> None:
    config = tinyscale_debug()
    tokenizer = Path(config.hf_assets_path)
    assert json.loads((tokenizer / "tokenizer_config.json").read_text())["eos_token"]
    assert (Path(config.dataloader.dataset_path) / "train.jsonl").is_file()
    assert config.parallelism.data_parallel_shard_degree == -1
    assert config.activation_checkpoint is None and not config.compile.enable
    assert (config.training.steps, config.training.seq_len) == (6, 128)


def test_assets_are_written_once_and_completely(tmp_path: Path) -> None:
    out = prepare_assets(tmp_path)
    lines = (out / "corpus" / "train.jsonl").read_text().splitlines()
    assert len(lines) > 10 and all(json.loads(line)["text"] for line in lines)
    assert not list((out / "corpus").glob("*.tmp"))
    vocab = json.loads((out / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) == VOCAB_SIZE
    stamp = (out / "corpus" / "train.jsonl").stat().st_mtime_ns
    prepare_assets(tmp_path)
    assert (out / "corpus" / "train.jsonl").stat().st_mtime_ns == stamp, "not rewritten"
