"""The LoRA fine-tuning script, code/scripts/finetune_lora.py, in-process.

A base model of 2 Lab 1 steps is enough to check what the script promises: the trainable
parameters and AdamW's bytes equal the formula, the held-out loss on the new text goes
down, the file holds the adapter alone and reloads onto a fresh base with the same
logits. The page's recorded run is checked against the same formulas. Its bad inputs are
cases of tests/scripts/bad_inputs.py, checked by test_bad_inputs.py.
"""

import re
from pathlib import Path

import pytest
import torch

from helpers import load_script, prose, recorded_output, said
from tinyscale.core.config import load_model_config
from tinyscale.workflows.lora import LoRAConfig, adapter_parameters_on_paper

PAGE = "workflows/lora.md"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("base")
    lab1 = load_script("train_tiny_transformer")
    assert lab1.main(["--epochs", "1", "--max-steps", "2", "--output-dir", str(out),
                      "--no-progress"]) == 0  # fmt: skip
    return out / "checkpoints" / "step_000002.pt"


def integer(pattern: str, text: str) -> int:
    return int(re.search(pattern, text)[1].replace(",", ""))


def check_output(lines: list[str], *, rank: int) -> None:
    """The formulas, read back from what the script printed."""
    text = "\n".join(lines)
    trainable = integer(r"([\d,]+) trainable", text)
    on_paper = integer(r"on paper ([\d,]+)", text)
    cfg = load_model_config()  # the Lab model: h 64, i 256, 2 blocks
    assert trainable == on_paper == adapter_parameters_on_paper(cfg, LoRAConfig(rank=rank))
    assert trainable == rank * 2 * ((64 + 192) + (64 + 64) + (64 + 256) + (256 + 64))
    adam = integer(r"AdamW state: ([\d,]+) bytes", text)
    assert adam == 2 * 4 * trainable
    before, after = (float(v) for v in re.search(r"new text: ([\d.]+) -> ([\d.]+)", text).groups())
    assert after < before
    saved = integer(r"adapter saved alone: .* \(([\d,]+) bytes\)", text)
    assert 4 * trainable < saved < 4 * trainable + 8000  # A and B in fp32, and the zip's index
    reloaded, merged = (
        float(v) for v in re.search(r"difference\| (\S+); merged: (\S+)", text).groups()
    )
    assert reloaded == 0.0 and merged < 1e-5


def test_finetune_trains_the_adapter_alone_and_reloads_it(
    base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = load_script("finetune_lora")
    argv = ["--base", str(base), "--rank", "4", "--max-steps", "6", "--warmup-steps", "0",
            "--output-dir", str(tmp_path / "out"), "--no-progress"]  # fmt: skip
    assert script.main(argv) == 0
    check_output(capsys.readouterr().out.splitlines(), rank=4)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["adapter.pt"]
    state = torch.load(tmp_path / "out" / "adapter.pt", weights_only=True)
    assert all(re.fullmatch(r"blocks\.\d\.(attn|ffn)\.\w+\.lora_[AB]", k) for k in state["adapter"])


def test_recorded_run_matches_the_formulas() -> None:
    lines = recorded_output(PAGE, "step_000100.pt --max-steps 50")
    check_output(lines, rank=8)


def test_the_pages_table_is_the_recorded_run_and_the_formulas() -> None:
    text = "\n".join(recorded_output(PAGE, "step_000100.pt --max-steps 50"))
    page = prose(PAGE)
    full = integer(r"device cpu \| ([\d,]+) parameters", "\n".join(recorded_output(
        PAGE, "--output-dir runs/lora/base --no-progress")))  # fmt: skip
    trainable = integer(r"([\d,]+) trainable", text)
    row = said(page, r"\| trainable parameters \| ([\d,]+) \| ([\d,]+) \(([\d.]+) %\) \|")
    assert row == (
        f"{full:,}",
        f"{trainable:,}",
        f"{100 * trainable / (full + trainable):.1f}",
    )  # of all, adapters too
    row = said(page, r"\| AdamW state \| ([\d,]+) bytes \| ([\d,]+) bytes \|")
    assert row == (f"{8 * full:,}", f"{8 * trainable:,}")
    row = said(
        page, r"\| gradients all-reduced by DDP, per step \| ([\d,]+) bytes \| ([\d,]+) bytes \|"
    )
    assert row == (f"{4 * full:,}", f"{4 * trainable:,}")
    saved = integer(r"adapter saved alone: .* \(([\d,]+) bytes\)", text)
    assert said(page, r"\| saved per fine-tune \| the whole model \| ([\d,]+) bytes \|") == (
        f"{saved:,}",
    )
    loss = re.search(r"new text: ([\d.]+ -> [\d.]+)", text)[1]
    assert said(
        page, r"\| held-out loss on asyncio, before -> after 50 steps \| not run \| (.*?) \|"
    ) == (loss,)
