"""torchtitan's debug model on CPU (code/scripts/torchtitan_train.py, tinyscale.compat.titan_config).

The training runs are the torchtitan page's code blocks: CI runs them (2 gloo ranks,
FSDP; then a resume from the step-3 checkpoint) and compares their output with the
recorded text. These tests check that recorded text — FSDP over 2 ranks, 6 steps, a loss
that falls, a resume that repeats steps 4 to 6 exactly — and the config function itself.
"""

import json
import re
from pathlib import Path

import pytest

from helpers import recorded_output

pytest.importorskip("torchtitan", reason="torchtitan is in the cluster extra: make setup")

# torchtitan's modules are imported in the tests that use them, not here: importing them
# costs seconds of CPU, and every pytest worker imports this file to collect it.


def recorded(command_end: str = "--config tinyscale_debug 2>&1") -> str:
    """The expected output the page records after the command that ends so."""
    return "\n".join(recorded_output("week-2/torchtitan.md", command_end))


def losses(out: str) -> dict[int, float]:
    return {int(s): float(v) for s, v in re.findall(r"step: +(\d+) +loss: +([\d.]+)", out)}


def test_recorded_run_is_fsdp_over_two_ranks() -> None:
    out = recorded()
    assert "dp_replicate=1, dp_shard=2, cp=1, tp=1" in out
    assert "Applied FSDP to the model" in out


def test_recorded_loss_falls_over_six_steps() -> None:
    first = losses(recorded())
    assert sorted(first) == [1, 2, 3, 4, 5, 6]
    assert first[6] < first[1] - 0.5
    assert "Saving a full checkpoint at last step, step 6." in recorded()


def test_recorded_resume_from_step_3_repeats_steps_4_to_6() -> None:
    resumed = recorded("--checkpoint.load-step 3 2>&1")
    assert "Loading the checkpoint from runs/torchtitan/out/checkpoint/step-3." in resumed
    first = losses(recorded())
    assert losses(resumed) == {step: first[step] for step in (4, 5, 6)}


def test_config_function_points_at_our_assets_and_sizes_for_a_laptop() -> None:
    from tinyscale.compat.titan_compat import needs_patches
    from tinyscale.compat.titan_config import tinyscale_debug

    config = tinyscale_debug()
    tokenizer = Path(config.hf_assets_path)
    assert json.loads((tokenizer / "tokenizer_config.json").read_text())["eos_token"]
    assert (Path(config.dataloader.dataset_path) / "train.jsonl").is_file()
    assert config.parallelism.data_parallel_shard_degree == -1
    assert config.activation_checkpoint is None and not config.compile.enable
    assert (config.training.steps, config.training.seq_len) == (6, 128)
    # fp32 without a GPU (a CPU emulates bf16 matmuls); torchtitan's bf16 default on GPUs
    expected = "float32" if needs_patches() else "bfloat16"
    assert config.training.mixed_precision_param == expected


def test_assets_are_written_once_and_completely(tmp_path: Path) -> None:
    from tinyscale.compat.titan_config import VOCAB_SIZE, prepare_assets

    out = prepare_assets(tmp_path)
    lines = (out / "corpus" / "train.jsonl").read_text().splitlines()
    assert len(lines) > 10 and all(json.loads(line)["text"] for line in lines)
    assert not list((out / "corpus").glob("*.tmp"))
    vocab = json.loads((out / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) == VOCAB_SIZE
    stamp = (out / "corpus" / "train.jsonl").stat().st_mtime_ns
    prepare_assets(tmp_path)
    assert (out / "corpus" / "train.jsonl").stat().st_mtime_ns == stamp, "not rewritten"
