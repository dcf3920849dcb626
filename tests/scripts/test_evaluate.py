"""code/scripts/evaluate.py on checkpoints the course's own scripts wrote, 2 steps each.

One model, four writers: Lab 1's loop (one file), the pipeline (pp 2: a ranked
directory), FSDP 2 (parallel_train.py: DCP) and DeepSpeed ZeRO-2 on 2 ranks. With
dropout 0, fp32 and the same 32-block batches they take the same two steps, so the
evaluation must score every checkpoint as Lab 1's own last held-out evaluation did: the
single file exactly (the same weights, the same function), the others to 1e-6.
The three distributed runs share one launch of 2 gloo ranks (``run_on_ranks``), which
also runs the sharded evaluation of the ranked checkpoint: equal to one process. Its bad
inputs (a path, a blocked --report, a flag; under torchrun too) are cases of
tests/scripts/bad_inputs.py, checked by test_bad_inputs.py; a damaged checkpoint is here.
"""

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import TIMEOUTS, load_script, prose, recorded_output, said
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.data import build_datasets
from tinyscale.core.errors import run_cli
from tinyscale.core.metrics import read_metrics
from tinyscale.core.training import data_and_plan
from tinyscale.workflows.evaluation import FIX

STEPS, BATCH = 2, "32"
# nats: the same two steps, their sums over ranks and micro-batches in another order (seen:
# 1.2e-7); a tied matrix read wrong or a missing tensor moves the loss by more than 0.01
OTHER_WRITERS = 1e-6


def common(out: Path, name: str, config: Path) -> list[str]:
    return ["--config", str(config), "--max-steps", str(STEPS), "--global-batch-size", BATCH,
            "--output-dir", str(out / name)]  # fmt: skip


def ranks(out: Path, name: str, config: Path) -> list[str]:
    return [*common(out, name, config), "--log-dir", str(out / "logs" / name)]


def distributed_writers(out: str, config: str) -> dict[str, Any]:
    """On each of 2 ranks: the three distributed scripts' training, then a sharded evaluation.

    The process group is run_on_ranks' own, so each script's ``train`` runs as its
    ``main`` would run it inside ``distributed()``.
    """
    root, cfg = Path(out), Path(config)
    os.environ["TORCH_EXTENSIONS_DIR"] = str(root / "ext")  # DeepSpeed must build nothing
    pipeline = load_script("pipeline_train")
    run = pipeline.check_inputs(pipeline.parse_args([*ranks(root, "ranked", cfg), "--pp", "2"]))
    data, plan = data_and_plan(run.cfg, run.model_cfg)  # what main() computes before joining
    pipeline.train(run, data, plan)
    shape = load_script("parallel_train")
    run = shape.check_inputs(shape.parse_args([*ranks(root, "dcp", cfg), "--fsdp", "2"]))
    shape.train(run, *data_and_plan(run.cfg, run.model_cfg))
    deepspeed = load_script("deepspeed_train")
    ds_args = [*ranks(root, "deepspeed", cfg), "--precision", "fp32",
               "--deepspeed-config", "code/config/deepspeed/zero2.json"]  # fmt: skip
    ds_args.remove("--global-batch-size"), ds_args.remove(BATCH)  # the JSON's: 16 x 2 ranks
    run = deepspeed.check_inputs(deepspeed.parse_args(ds_args))
    with deepspeed.quiet_deepspeed():
        deepspeed.train(run, data)
    evaluate = load_script("evaluate")
    args = evaluate.parse_args([str(root / "ranked" / "checkpoints"), "--config", config,
                                "--global-batch-size", BATCH])  # fmt: skip
    return evaluate.evaluate_checkpoint(args, evaluate.check_inputs(args), torch.device("cpu"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("evaluate")
    config = json.loads(Path("code/config/config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "dropout": 0.0}))
    lab1 = load_script("train_tiny_transformer")
    argv = [*common(out, "single", out / "config.json"), "--eval-every", str(STEPS)]
    assert lab1.main([*argv, "--device", "cpu", "--no-progress"]) == 0
    sharded = run_on_ranks(distributed_writers, 2, str(out), str(out / "config.json"), **TIMEOUTS)
    (out / "sharded.json").write_text(json.dumps(sharded))
    return out


def evaluate(runs: Path, name: str, *extra: str) -> dict[str, Any]:
    """The script as a user runs it (one process), on a run's checkpoints folder."""
    report = runs / f"{name}.report.json"
    argv = [str(runs / name / "checkpoints"), "--config", str(runs / "config.json"),
            "--global-batch-size", BATCH, "--report", str(report), *extra]  # fmt: skip
    assert run_cli(load_script("evaluate").main, argv) == 0
    return json.loads(report.read_text())


def lab1_last_heldout(runs: Path) -> float:
    records = read_metrics(runs / "single" / "metrics.jsonl")
    last = [r for r in records if r["split"] == "heldout"][-1]
    assert last["step"] == STEPS
    return last["loss"]


def test_lab1_checkpoint_scores_as_its_own_last_evaluation(runs: Path) -> None:
    report = evaluate(runs, "single")
    assert (report["kind"], report["step"], report["model_config_from"]) == (
        "single", STEPS, "checkpoint")  # fmt: skip
    assert report["loss"] == lab1_last_heldout(runs)  # bit for bit: evaluate() on the same weights
    data = build_datasets(vocab_size=1024, block_size=64)
    assert report["blocks"] == len(data.heldout) and report["tokens"] == 64 * len(data.heldout)
    assert report["ranks"] == 1 and report["parameters"] == 169_728


@pytest.mark.parametrize(
    ("name", "kind", "config_from"),
    [("ranked", "ranked", "checkpoint"), ("dcp", "dcp", "--config"),
     ("deepspeed", "deepspeed", "--config")],
)  # fmt: skip
def test_every_writer_scores_the_same_two_steps(
    runs: Path, name: str, kind: str, config_from: str
) -> None:
    report = evaluate(runs, name, "--max-new-tokens", "4")
    assert (report["kind"], report["step"]) == (kind, STEPS)
    wanted = "checkpoint" if config_from == "checkpoint" else str(runs / "config.json")
    assert report["model_config_from"] == wanted
    assert report["loss"] == pytest.approx(lab1_last_heldout(runs), abs=OTHER_WRITERS)
    assert not (runs / "ext").exists(), "DeepSpeed JIT-built an op"


def test_sharded_evaluation_equals_one_process(runs: Path) -> None:
    rank0, rank1 = json.loads((runs / "sharded.json").read_text())
    one = evaluate(runs, "ranked")
    assert rank0["ranks"] == 2 and rank0["blocks"] == one["blocks"]
    assert rank0["loss"] == rank1["loss"]  # all-reduced: every rank holds the same sums
    assert rank0["loss"] == pytest.approx(one["loss"], abs=1e-6)  # batches cut elsewhere
    assert rank0["sample"] == rank1["sample"] == one["sample"]  # seeded: the same text


def test_the_sample_is_reproducible_and_follows_the_seed(runs: Path) -> None:
    """Rerun with the same seed: test_sharded_evaluation_equals_one_process (3 draws)."""
    first = evaluate(runs, "single", "--max-new-tokens", "8")
    other = evaluate(runs, "single", "--max-new-tokens", "8", "--seed", "1")
    assert first["sample"]["seed"] == 0 and first["sample"]["text"] != other["sample"]["text"]
    greedy = evaluate(runs, "single", "--temperature", "0", "--seed", "1")
    top1 = evaluate(runs, "single", "--top-k", "1")
    assert greedy["sample"]["text"] == top1["sample"]["text"]


def test_another_model_shape_is_refused_naming_the_config(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"hidden_size": 32, "intermediate_size": 128}))
    argv = [str(runs / "dcp" / "checkpoints"), "--config", str(small), "--report",
            str(tmp_path / "r.json")]  # fmt: skip
    assert run_cli(load_script("evaluate").main, argv) == 2
    err = capsys.readouterr().err
    assert "has tok_emb.weight of shape (1024, 64), the config gives (1024, 32)" in err
    assert err.endswith("pass the --config it was trained with\n") and err.count("\n") == 1


# ---------------------------------------------------------------------------- the page

PAGE = "workflows/evaluation.md"


def loss_in(lines: list[str]) -> str:
    (found,) = [m[1] for line in lines if (m := re.search(r"loss (\d+\.\d{6})\b", line))]
    return found


def test_page_scores_as_the_training_log_and_one_process_as_two() -> None:
    trained = recorded_output(PAGE, "train_tiny_transformer.py --max-steps 40")
    single = recorded_output(PAGE, "cat runs/evaluation/lab1/report.json")
    logged = re.search(r"step   40/\d+ .* held-out loss (\d\.\d{3})", "\n".join(trained))[1]
    report = json.loads("\n".join(single[4:]))  # the JSON after the 4 printed lines
    assert (report["kind"], report["step"], report["ranks"]) == ("single", 40, 1)
    assert f"{report['loss']:.3f}" == logged and f"{report['loss']:.6f}" in single[1]
    assert report["sample"]["text"] in single[2].encode().decode("unicode_escape")
    sharded = recorded_output(PAGE, "torchrun --standalone --nproc-per-node 2 code/scripts/eval")
    one = recorded_output(PAGE, "one process: {scores['blocks']}")
    assert "on 2 rank(s)" in sharded[1] and loss_in(sharded) == loss_in(one)
    assert loss_in(recorded_output(PAGE, "lab1-dcp")) == f"{report['loss']:.6f}"  # exercise 2
    text = prose(PAGE)
    assert said(text, r"the evaluation of its checkpoint says (\d\.\d+)") == (loss_in(single),)
    assert said(text, r"printed loss (\d\.\d+) on 2 ranks, one process (\d\.\d+)") == (
        loss_in(sharded), loss_in(one))  # fmt: skip
    assert said(text, r"each scores (\d+) of the (\d+) blocks") == ("184", str(report["blocks"]))
    assert said(text, r"shares of (\d+), (\d+) and (\d+)") == ("122", "123", "123")
    assert [len(range(368 * r // 3, 368 * (r + 1) // 3)) for r in range(3)] == [122, 123, 123]


@pytest.mark.parametrize(
    ("name", "tear", "why"),
    [
        ("single", "", "is cut short (no zip directory at its end"),
        ("ranked", "manifest.json", "is damaged (not the JSON a save writes)"),
        ("ranked", "rank_00001.pt", "is damaged (100 bytes, manifest.json lists"),
        ("dcp", ".metadata", "is damaged (100 bytes, manifest.json lists"),
        ("dcp", "__1_0.distcp", "is damaged (100 bytes, manifest.json lists"),
        ("dcp", "manifest.json", "is damaged (not the JSON a save writes)"),
        ("dcp-no-manifest", "__1_0.distcp", "is damaged: DCP cannot read it"),
    ],
)
def test_a_torn_checkpoint_is_one_line_exit_2_no_report(
    runs: Path, name: str, tear: str, why: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Every file of every layout cut short, as a failed copy leaves it: named in one line
    that says what to evaluate instead, before anything is read. A DCP folder written
    elsewhere, with no manifest, is read, and whatever DCP cannot read is one line too."""
    step = runs / name.removesuffix("-no-manifest") / "checkpoints" / "step_000002"
    if name == "single":
        path = copy = Path(shutil.copy(step.with_suffix(".pt"), tmp_path / "step_000002.pt"))
    else:
        copy = Path(shutil.copytree(step, tmp_path / "step_000002"))
        path = copy / tear
        if name == "dcp-no-manifest":
            (copy / "manifest.json").unlink()
    path.write_bytes(path.read_bytes()[:100])
    report = tmp_path / "r.json"
    argv = [str(copy), "--config", str(runs / "config.json"), "--report", str(report)]
    assert run_cli(load_script("evaluate").main, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and why in err and err.count("\n") == 1, err
    assert err.endswith(f"; {FIX}\n") and "--resume" not in err and not report.exists()
