"""Week 3's pipeline training script, code/scripts/pipeline_train.py.

The runs are the pipeline page's code blocks: CI runs them (torchrun, 2 gloo ranks, 8
steps of 1F1B; then, with step 8's manifest removed as if the save never finished,
``--resume auto``) and compares their output with the recorded text. These tests check
that text — the stage split, the loss logged from the last stage, a resume that picks the
last complete checkpoint and repeats the same losses. Its bad flags are cases of
tests/scripts/bad_inputs.py, checked by test_bad_inputs.py.

The resume tests launch 2 gloo ranks once (PP 2, dropout on): 2 steps saved after each,
then a copy with step 2's manifest torn resumed with --resume auto: every rank's state at
step 2 is the uninterrupted run's, bit for bit. On copies, a torn manifest or rank file is
skipped with one line and refused by name, exit code 2, as is another model's checkpoint
or one at the run's end.
"""

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers import TIMEOUTS, load_script, recorded_output, torn_copy
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.checkpoint import MANIFEST, load_checkpoint
from tinyscale.core.training import data_and_plan

PAGE = "week-3/pipeline-torchtitan.md"


def losses(lines: list[str]) -> dict[int, float]:
    found = (re.search(r"step +(\d+)/\d+ \| loss ([\d.]+)", line) for line in lines)
    return {int(m[1]): float(m[2]) for m in found if m}


def test_recorded_run_splits_two_blocks_over_two_ranks_and_logs_the_last_stage() -> None:
    lines = recorded_output(PAGE, "rm -rf runs/pipeline")
    text = "\n".join(lines)
    assert "pp 2 x dp 1 | 1f1b | 4 micro-batches of 4 | loss on rank 1" in text
    assert "rank 0: stage 0 = blocks [0]" in text and "rank 1: stage 1 = blocks [1]" in text
    first = losses(lines)
    assert sorted(first) == [2, 4, 6, 8] and first[8] < first[2]
    assert [line.split("| ")[-1] for line in lines if "saved" in line] == [
        "saved runs/pipeline/checkpoints/step_000004",
        "saved runs/pipeline/checkpoints/step_000008",
    ]


def test_recorded_resume_skips_the_uncommitted_step_and_repeats_the_losses() -> None:
    first = losses(recorded_output(PAGE, "rm -rf runs/pipeline"))
    resumed_lines = recorded_output(PAGE, "--resume auto")
    assert any(line.endswith("resumed from step 4") for line in resumed_lines)
    assert losses(resumed_lines) == {6: first[6], 8: first[8]}


# ------------------------------------------------- resume: exact with dropout, never corrupt

PP2 = ["--pp", "2", "--max-steps", "2", "--microbatches", "2"]  # 2 gloo ranks, dropout 0.1


def pipeline_runs(root: str) -> None:
    """On each of 2 ranks: 2 steps of --pp 2 with dropout on, a checkpoint after each
    (``whole``); then a copy of its checkpoints with step 2's manifest torn, resumed."""
    script, out = load_script("pipeline_train"), Path(root)

    def train(name: str, *argv: str) -> None:
        folders = ["--output-dir", str(out / name), "--log-dir", str(out / name / "logs")]
        run = script.check_inputs(script.parse_args([*PP2, *folders, *argv]))
        script.train(run, *data_and_plan(run.cfg, run.model_cfg))

    train("whole", "--checkpoint-every", "1")
    if dist.get_rank() == 0:
        copy = out / "resumed" / "checkpoints"
        shutil.copytree(out / "whole" / "checkpoints", copy)
        (copy / "step_000002" / MANIFEST).write_text('{"format": "tinyscale.ranked_checkpo')
    dist.barrier()
    train("resumed", "--resume", "auto")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pipeline")
    run_on_ranks(pipeline_runs, 2, str(out), **TIMEOUTS)
    return out


def test_pipeline_resume_with_dropout_on_is_bit_for_bit(pipeline: Path) -> None:
    """Resumed from step 1 past a torn step 2: every rank's stages, AdamW state and RNG
    state at step 2 equal the uninterrupted run's."""
    for rank in (0, 1):
        whole, resumed = (
            load_checkpoint(pipeline / run / "checkpoints" / "step_000002" / f"rank_0000{rank}.pt")
            for run in ("whole", "resumed")
        )
        assert all(torch.equal(whole["model"][k], v) for k, v in resumed["model"].items())
        assert whole["model"].keys() == resumed["model"].keys()
        moments = [
            (whole["optimizer"]["state"][i], s) for i, s in resumed["optimizer"]["state"].items()
        ]
        assert all(torch.equal(a[k], b[k]) for a, b in moments for k in b)
        assert torch.equal(whole["rng_cpu"], resumed["rng_cpu"])
    log = (pipeline / "resumed" / "logs" / "rank_0" / "train.log").read_text()
    assert "resumed from step 1" in log


@pytest.fixture
def torn(tmp_path: Path, pipeline: Path) -> Callable[[str], Path]:
    """``torn(name)``: the whole run's checkpoints, step 2's ``name`` cut short."""
    return lambda name: torn_copy(pipeline / "whole" / "checkpoints", tmp_path / "torn", 2, name)


@pytest.mark.parametrize("name", [MANIFEST, "rank_00001.pt"])
def test_a_torn_file_is_skipped_by_auto_and_refused_by_name(
    name: str, torn: Callable[[str], Path], bad_input: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    out = torn(name)
    step2 = out / "checkpoints" / "step_000002"
    why = "(not the JSON a save writes)" if name == MANIFEST else "(100 bytes, manifest.json"
    error = bad_input("pipeline_train", [*PP2, "--resume", str(step2)], WORLD_SIZE="2")
    assert error.startswith(f"error: {step2 / name} is damaged {why}")
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "1"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)  # rank 0's checks, as torchrun starts it
    script = load_script("pipeline_train")
    argv = [*PP2, "--resume", "auto", "--output-dir", str(out), "--log-dir", str(out / "logs")]
    run = script.check_inputs(script.parse_args(argv))
    assert run.checkpoint == out / "checkpoints" / "step_000001" and run.resume["step"] == 1
    err = capsys.readouterr().err
    assert err == f"warning: skipped step_000002: {error.removeprefix('error: ').split('; ')[0]}\n"


def test_another_models_checkpoint_or_one_at_the_end_is_one_line(
    pipeline: Path, tmp_path: Path, bad_input: Callable[..., str]
) -> None:
    step2 = pipeline / "whole" / "checkpoints" / "step_000002"
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"hidden_size": 32, "intermediate_size": 128}))
    other = bad_input("pipeline_train", [*PP2, "--resume", str(step2), "--config", str(small)],
                      WORLD_SIZE="2")  # fmt: skip
    assert other == (
        f"error: checkpoint {step2}/rank_00000.pt was trained with hidden_size=64, but the "
        "config says hidden_size=32: pass the --config it was trained with, or start a new run"
    )
    assert bad_input("pipeline_train", [*PP2, "--resume", str(step2)], WORLD_SIZE="2") == (
        "error: the checkpoint is at step 2, the end of this run: raise --max-steps to train further"
    )
