"""Week 4's training script on any shape, code/scripts/parallel_train.py.

The runs are the page's code blocks: CI runs them (torchrun, 4 gloo ranks: FSDP 2 x TP 2
for two steps, resumed as PP 2 x DP 2 for two more, then as PP 2 x TP 2 for two more; and
one process for six steps) and compares their output with the recorded text. These tests
check that text: every shape's losses and gradient norms are those of one process, the
resumes name the shape that saved them, and the parameters a rank holds are the page's
count. Its bad flags are cases of tests/scripts/bad_inputs.py, checked by
test_bad_inputs.py.

The resume tests launch 2 gloo ranks once (DP 2, dropout on): 3 steps saved after each,
then a copy with step 3 torn and step 2 unfinished resumed with --resume auto. They check
the resume is the run that never stopped, bit for bit, and on copies of its checkpoints
that every kind of file cut short is skipped by --resume auto with one line and refused
by name, exit code 2, as is another model's checkpoint or one at the run's end.
"""

import contextlib
import io
import json
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers import TIMEOUTS, load_script, prose, recorded_output, said, torn_copy
from tinyscale.comm.launch import run_on_ranks
from tinyscale.composed.shape_checkpoint import STATE_FILE
from tinyscale.core.checkpoint import MANIFEST, checkpoint_problem, load_checkpoint
from tinyscale.core.config import load_model_config
from tinyscale.core.training import data_and_plan

PAGE = "week-4/train-any-shape.md"


def steps(lines: list[str]) -> dict[int, tuple[str, str]]:
    """step -> (loss, grad norm), as printed."""
    found = (re.search(r"step +(\d+)/\d+ \| loss ([\d.]+) \| grad norm ([\d.]+)", x) for x in lines)
    return {int(m[1]): (m[2], m[3]) for m in found if m}


def held(lines: list[str]) -> tuple[int, int]:
    m = next(re.search(r"holds ([\d,]+) of its stage's ([\d,]+)", x) for x in lines if "holds" in x)
    return int(m[1].replace(",", "")), int(m[2].replace(",", ""))


def test_every_shape_trains_like_one_process_across_two_resumes() -> None:
    one = steps(recorded_output(PAGE, "--nproc-per-node 1"))
    first = recorded_output(PAGE, "--fsdp 2 --tp 2 --dropout 0")
    second = recorded_output(PAGE, "--pp 2 --dp 2 --dropout 0")
    third = recorded_output(PAGE, "--pp 2 --tp 2 --dropout 0")
    assert sorted(one) == [1, 2, 3, 4, 5, 6] and float(one[6][0]) < float(one[1][0])
    assert steps(first) == {1: one[1], 2: one[2]}
    assert steps(second) == {3: one[3], 4: one[4]}
    assert steps(third) == {5: one[5], 6: one[6]}
    assert "resumed from step 2, saved by {'pp': 1, 'dp': 1, 'fsdp': 2, 'tp': 2}" in second[0]
    assert "resumed from step 4, saved by {'pp': 2, 'dp': 2, 'fsdp': 1, 'tp': 1}" in third[0]
    prose = " ".join(Path("docs", PAGE).read_text().split())  # lines wrapped anywhere
    assert ", ".join(one[s][0] for s in (1, 2, 3, 4)) in prose
    assert f"{one[5][0]} and {one[6][0]}" in prose


def test_each_rank_holds_the_parameters_the_page_counts() -> None:
    cfg = load_model_config("code/config/config.json")
    h, i, v, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
    T = cfg.max_position_embeddings
    split = 3 * h * h + 3 * h + h * h + h * i + i + i * h  # a block's TP-split tensors
    whole = h + h + 4 * h  # the row-parallel biases and the norms: whole on every TP rank
    # FSDP 2 x TP 2, one stage: the embedding and the split tensors / 4, the rest / 2
    model = v * h + T * h + L * (split + whole) + 2 * h
    assert held(recorded_output(PAGE, "--fsdp 2 --tp 2 --dropout 0")) == (
        (v * h + L * split) // 4 + (T * h + L * whole + 2 * h) // 2,
        model,
    )
    stage0 = v * h + T * h + split + whole  # PP 2: the embedding and block 0
    assert held(recorded_output(PAGE, "--pp 2 --dp 2 --dropout 0")) == (stage0, stage0)
    assert held(recorded_output(PAGE, "--pp 2 --tp 2 --dropout 0")) == (
        (v * h + split) // 2 + T * h + whole,
        stage0,
    )
    assert recorded_output(PAGE, "by_four // 4") == [
        str(held(recorded_output(PAGE, "--fsdp 2 --tp 2 --dropout 0"))[0])
    ]


# ------------------------------------------------- resume: exact with dropout, never corrupt

STEPS = 3
DP2 = ["--dp", "2", "--max-steps", str(STEPS)]  # 2 gloo ranks, the Lab model, dropout 0.1


def dropout_runs(root: str) -> str:
    """On each of 2 ranks: 3 steps of --dp 2 with dropout on, a checkpoint after each
    (``whole``); then a copy of its checkpoints with step 3 torn and step 2's manifest gone
    (a save that never finished), resumed with --resume auto (``resumed``). Returns what
    rank 0 wrote on stderr before training (the skip lines)."""
    script, out = load_script("parallel_train"), Path(root)

    def train(name: str, *argv: str) -> None:
        folders = ["--output-dir", str(out / name), "--log-dir", str(out / name / "logs")]
        run = script.check_inputs(script.parse_args([*DP2, *folders, *argv]))
        script.train(run, *data_and_plan(run.cfg, run.model_cfg))

    train("whole", "--checkpoint-every", "1")
    if dist.get_rank() == 0:
        resumed = Path(
            shutil.copytree(out / "whole" / "checkpoints", out / "resumed" / "checkpoints")
        )
        (resumed / "step_000002" / MANIFEST).unlink()
        shard = resumed / "step_000003" / "__1_0.distcp"
        shard.write_bytes(shard.read_bytes()[:1000])
    dist.barrier()
    with contextlib.redirect_stderr(io.StringIO()) as err:
        train("resumed", "--checkpoint-every", str(STEPS), "--resume", "auto")
    return err.getvalue()


@pytest.fixture(scope="module")
def dropout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dropout")
    stderr = run_on_ranks(dropout_runs, 2, str(out), **TIMEOUTS)
    (out / "stderr.json").write_text(json.dumps(stderr))
    return out


def logged(out: Path, name: str) -> list[str]:
    return (out / name / "logs" / "rank_0" / "train.log").read_text().splitlines()


def whole_tensors(step_dir: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a DCP checkpoint, read on one process (weights, AdamW, step)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with warnings.catch_warnings():  # "assuming ... a single process": yes
        warnings.simplefilter("ignore", UserWarning)
        dcp_to_torch_save(step_dir, tmp_path / f"{step_dir.parent.parent.name}.pt")
    return torch.load(tmp_path / f"{step_dir.parent.parent.name}.pt", weights_only=True)


def test_resume_with_dropout_on_is_the_uninterrupted_run_bit_for_bit(
    dropout: Path, tmp_path: Path
) -> None:
    """Resumed from step 1 (3 torn, 2 unfinished): steps 2 and 3 log the same losses and
    norms, and step 3's weights, AdamW moments and every rank's RNG state are equal."""
    whole, resumed = steps(logged(dropout, "whole")), steps(logged(dropout, "resumed"))
    assert sorted(whole) == [1, 2, 3] and resumed == {2: whole[2], 3: whole[3]}
    assert any(
        "resumed from step 1, saved by {'pp': 1, 'dp': 2" in x for x in logged(dropout, "resumed")
    )
    a = whole_tensors(dropout / "whole" / "checkpoints" / "step_000003", tmp_path)
    b = whole_tensors(dropout / "resumed" / "checkpoints" / "step_000003", tmp_path)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    states = [load_checkpoint(dropout / run / "checkpoints" / "step_000003" / STATE_FILE)
              for run in ("whole", "resumed")]  # fmt: skip
    assert all(map(torch.equal, states[0]["rng_cpu"], states[1]["rng_cpu"]))  # every rank's
    for key in ("step", "epoch", "shape", "model_config", "world_size"):
        assert states[0][key] == states[1][key], key
    assert not torch.equal(*states[0]["rng_cpu"])  # each rank draws its own dropout masks


def test_resume_auto_skips_the_torn_and_the_unfinished_with_one_line_each(dropout: Path) -> None:
    rank0 = json.loads((dropout / "stderr.json").read_text())[0].splitlines()
    checkpoints = dropout / "resumed" / "checkpoints"
    assert rank0 == [
        f"warning: skipped step_000003: {checkpoints}/step_000003/__1_0.distcp is damaged "
        f"(1,000 bytes, manifest.json lists "
        f"{(dropout / 'whole' / 'checkpoints' / 'step_000003' / '__1_0.distcp').stat().st_size:,})",
        f"warning: skipped step_000002: {checkpoints}/step_000002 has no manifest.json: the "
        "save never finished (a rank died before rank 0 committed it)",
    ]
    # the unfinished folder was removed at the start; the torn step 3 was saved anew, whole
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_000001", "step_000003"]
    assert checkpoint_problem(checkpoints / "step_000003") is None


@pytest.fixture
def torn(tmp_path: Path, dropout: Path) -> Callable[[str], Path]:
    """``torn(name)``: the whole run's checkpoints, step 3's ``name`` cut short."""
    return lambda name: torn_copy(dropout / "whole" / "checkpoints", tmp_path / "torn", 3, name)


@pytest.mark.parametrize("name", [".metadata", "__1_0.distcp", MANIFEST, STATE_FILE])
def test_a_torn_file_is_skipped_by_auto_and_refused_by_name(
    name: str, torn: Callable[[str], Path], bad_input: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    out = torn(name)
    step3 = out / "checkpoints" / "step_000003"
    why = "(not the JSON a save writes)" if name == MANIFEST else "(100 bytes, manifest.json"
    error = bad_input("parallel_train", [*DP2, "--resume", str(step3)], WORLD_SIZE="2")
    assert error.startswith(f"error: {step3 / name} is damaged {why}")
    for key, value in {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
    }.items():  # rank 0's checks, as torchrun starts it
        monkeypatch.setenv(key, value)
    script = load_script("parallel_train")
    argv = [*DP2, "--resume", "auto", "--output-dir", str(out), "--log-dir", str(out / "logs")]
    run = script.check_inputs(script.parse_args(argv))
    assert run.checkpoint == out / "checkpoints" / "step_000002" and run.resume["step"] == 2
    err = capsys.readouterr().err
    assert err == f"warning: skipped step_000003: {error.removeprefix('error: ').split('; ')[0]}\n"


def test_another_models_checkpoint_or_one_at_the_end_is_one_line(
    dropout: Path, tmp_path: Path, bad_input: Callable[..., str]
) -> None:
    step3 = str(dropout / "whole" / "checkpoints" / "step_000003")
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"hidden_size": 32, "intermediate_size": 128}))
    other = bad_input("parallel_train", [*DP2, "--resume", step3, "--config", str(small)],
                      WORLD_SIZE="2")  # fmt: skip
    assert other == (
        f"error: checkpoint {step3}/{STATE_FILE} was trained with hidden_size=64, but the "
        "config says hidden_size=32: pass the --config it was trained with, or start a new run"
    )
    assert bad_input("parallel_train", [*DP2, "--resume", step3], WORLD_SIZE="2") == (
        f"error: the checkpoint is at step {STEPS}, the end of this run: raise --max-steps to train further"
    )


def test_page_resumes_exactly_with_dropout_and_skips_the_torn_shard() -> None:
    whole = steps(recorded_output(PAGE, "--checkpoint-every 2 --output-dir runs/shape-dropout"))
    skipped, *resumed = recorded_output(PAGE, "truncate -s 1000")
    assert sorted(whole) == [1, 2, 3, 4] and steps(resumed) == {3: whole[3], 4: whole[4]}
    assert "resumed from step 2, saved by {'pp': 1, 'dp': 2, 'fsdp': 1, 'tp': 1}" in resumed[0]
    damaged = "runs/shape-resumed/checkpoints/step_000004/__1_0.distcp is damaged (1,000 bytes"
    assert skipped.startswith(f"warning: skipped step_000004: {damaged}")
    assert recorded_output(PAGE, "dcp_to_torch_save(") == [
        "step 4: 86 tensors, equal bit for bit: True",
        "every rank's random-number state equal: True",
    ]
    assert said(prose(PAGE), r"the run that never stopped, (\d\.\d+) and (\d\.\d+)") == (
        whole[3][0], whole[4][0])  # fmt: skip
