"""code/scripts/accelerate_train.py, launched for real with `accelerate launch` on 2 CPU processes.

One launch (about 15 s on 2 cores) with gradient accumulation 2 and dropout 0, then checks:

- it exits 0 and the loss falls;
- each process trained on its own blocks, exactly the shard the page describes: micro-batch
  j of the epoch's shuffle goes to process j % 2, and the shards of one optimizer step add up
  to Lab 1's batch of that step;
- both processes end with bit-identical weights, and the main process's checkpoint holds them
  and loads with tinyscale.core.checkpoint.load_checkpoint;
- parity: the 2-process, 2-micro-batch run takes the same steps as Lab 1's single-process loop
  on the whole 16-block batch (losses within 1e-5 nats, weights within 1e-4).

Bad input is refused with one `error:` line and exit code 2, and nothing is written: the
flags here, each with Accelerate's process-wide state reset; a blocked output and --seed
are cases of tests/scripts/bad_inputs.py, checked by test_bad_inputs.py.
"""

import functools
import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from helpers import ROOT, load_script
from tinyscale.comm.launch import free_port
from tinyscale.core.checkpoint import load_checkpoint
from tinyscale.core.config import load_model_config
from tinyscale.core.data import LMData, build_datasets, epoch_batches
from tinyscale.core.errors import run_cli
from tinyscale.core.metrics import read_metrics
from tinyscale.core.model import TinyTransformer

SCRIPT = ROOT / "code" / "scripts" / "accelerate_train.py"
RECORDED = ROOT / "docs" / "generated" / "accelerate"
ACCELERATE_CONFIG = ROOT / "code" / "config" / "accelerate_cpu.yaml"
PROCESSES, ACCUM, GLOBAL_BATCH, STEPS, SEED = 2, 2, 16, 20, 0
MICRO = GLOBAL_BATCH // (PROCESSES * ACCUM)
# Summation order differs (two halves all-reduced vs one batch): float32 rounding only.
LOSS_TOLERANCE = 1e-5  # nats, per step
WEIGHT_TOLERANCE = 1e-4  # max absolute difference of any weight after 20 Adam steps


def accelerate_cli() -> str:
    """The venv's `accelerate`, the one installed next to this interpreter."""
    beside = Path(sys.executable).with_name("accelerate")
    return str(beside) if beside.is_file() else "accelerate"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return load_script("accelerate_train")


@pytest.fixture(scope="module")
def no_dropout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped config with dropout 0: then masks cannot differ between 1 and 2 processes."""
    config = json.loads((ROOT / "code" / "config" / "config.json").read_text())
    config["dropout"] = 0.0
    path = tmp_path_factory.mktemp("config") / "config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory, no_dropout: Path) -> dict:
    out = tmp_path_factory.mktemp("accelerate")
    cmd = [
        accelerate_cli(),
        "launch",
        "--config_file",  # hermetic: a ~/.cache/huggingface default config is not read
        str(ACCELERATE_CONFIG),
        "--main_process_port",
        str(free_port()),
        str(SCRIPT),
        "--cpu",
        "--config",
        str(no_dropout),
        "--global-batch-size",
        str(GLOBAL_BATCH),
        "--grad-accum-steps",
        str(ACCUM),
        "--max-steps",
        str(STEPS),
        "--eval-every",
        "10",
        "--seed",
        str(SEED),
        "--output-dir",
        str(out / "run"),
        "--log-dir",
        str(out / "logs"),
        "--no-progress",
    ]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    return {"proc": proc, "run": out / "run", "logs": out / "logs"}


def rank_lines(launched: dict, rank: int) -> list[str]:
    return (launched["logs"] / f"rank_{rank}" / "train.log").read_text().splitlines()


def step_digests(launched: dict, rank: int) -> list[str]:
    found = [
        re.search(r"\] step (\d+) \| blocks (\w+) \|", line) for line in rank_lines(launched, rank)
    ]
    steps = [(int(m.group(1)), m.group(2)) for m in found if m]
    assert [s for s, _ in steps] == list(range(1, STEPS + 1))
    return [d for _, d in steps]


# ---------------------------------------------------------------------------- the launch


def test_launch_succeeds_on_two_gloo_processes(launched: dict) -> None:
    proc = launched["proc"]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "Accelerate: 2 processes (MULTI_CPU, backend gloo) | device cpu" in proc.stdout
    assert "4 blocks per micro-batch x 2 accumulation step(s) x 2 processes = 16" in proc.stdout
    assert "(identical)" in proc.stdout
    # the main process alone prints; the other one writes only its file
    assert "[RANK 1]" not in proc.stdout
    assert "process 1 of 2" in rank_lines(launched, 1)[0]


def test_loss_falls(launched: dict) -> None:
    records = read_metrics(launched["run"] / "metrics.jsonl")
    train = [r["loss"] for r in records if r["split"] == "train"]
    heldout = [r["loss"] for r in records if r["split"] == "heldout"]
    assert len(train) == STEPS
    assert sum(train[-5:]) / 5 < sum(train[:5]) / 5 - 0.5  # nats
    assert heldout[-1] < heldout[0] - 0.5


def expected_shard(
    *, rank: int, step: int, micro: int, accum: int, processes: int = PROCESSES
) -> tuple[str, list[int]]:
    """The page's rule: micro-batch j of the epoch's shuffle goes to process j % processes.

    Returns the digest the script logs for (rank, step) and the block indices behind it.
    """
    data = lab1_data()
    order = torch.cat(epoch_batches(len(data.train), 1, seed=SEED, epoch=0))  # the shuffle
    sha, indices = hashlib.sha1(), []
    for k in range(accum):
        j = (step * accum + k) * processes + rank
        block_ids = order[j * micro : (j + 1) * micro].tolist()
        sha.update(torch.stack([data.train[i][0] for i in block_ids]).numpy().tobytes())
        indices += block_ids
    return sha.hexdigest()[:8], indices


@functools.cache
def lab1_data() -> LMData:
    return build_datasets(vocab_size=1024, block_size=64)


def test_each_process_trains_its_own_shard_of_lab1s_batch(launched: dict) -> None:
    """Recompute every digest from the epoch's shuffle: micro-batch j goes to process j % 2."""
    lab1_batches = epoch_batches(len(lab1_data().train), GLOBAL_BATCH, seed=SEED, epoch=0)
    logged = {rank: step_digests(launched, rank) for rank in range(PROCESSES)}
    for step in range(STEPS):
        shards = []
        for rank in range(PROCESSES):
            digest, indices = expected_shard(rank=rank, step=step, micro=MICRO, accum=ACCUM)
            assert logged[rank][step] == digest, (rank, step)
            shards.append(set(indices))
        assert not shards[0] & shards[1], "two processes trained on the same block"
        assert shards[0] | shards[1] == set(lab1_batches[step].tolist())


def test_parameters_are_identical_on_every_process_and_in_the_checkpoint(
    launched: dict, script: ModuleType, no_dropout: Path
) -> None:
    digests = [
        next(
            line.split("parameters ")[1]
            for line in rank_lines(launched, r)
            if "parameters " in line
        )
        for r in range(PROCESSES)
    ]
    assert digests[0] == digests[1]
    cfg = load_model_config(no_dropout)
    state = load_checkpoint(launched["run"] / "checkpoints" / f"step_{STEPS:06d}.pt", expect=cfg)
    model = TinyTransformer(cfg)
    model.load_state_dict(state["model"])  # unwrapped: no "module." prefix
    assert script.param_digest(model) == digests[0]
    assert state["step"] == STEPS and state["num_processes"] == PROCESSES
    assert state["train_config"]["global_batch_size"] == GLOBAL_BATCH
    records = read_metrics(launched["run"] / "metrics.jsonl")
    assert state["history"] == records
    assert sorted(p.name for p in (launched["run"] / "checkpoints").iterdir()) == [
        f"step_{STEPS:06d}.pt"  # one writer, no temporary files left
    ]


def test_same_steps_as_lab1_single_process_loop(
    launched: dict, no_dropout: Path, tmp_path: Path
) -> None:
    """2 processes x 2 micro-batches of 4 blocks == one process on the 16-block batch."""
    lab1 = load_script("train_tiny_transformer")
    args = [
        "--config",
        str(no_dropout),
        "--global-batch-size",
        str(GLOBAL_BATCH),
        "--seed",
        str(SEED),
    ]
    args += ["--max-steps", str(STEPS), "--device", "cpu", "--no-progress"]
    assert lab1.main([*args, "--output-dir", str(tmp_path)]) == 0
    want = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "train"]
    got = [r for r in read_metrics(launched["run"] / "metrics.jsonl") if r["split"] == "train"]
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want, strict=True):
        assert g["loss"] == pytest.approx(w["loss"], abs=LOSS_TOLERANCE), g["step"]
        assert g["lr"] == w["lr"]  # the same schedule, step for step
    mine = load_checkpoint(launched["run"] / "checkpoints" / f"step_{STEPS:06d}.pt")["model"]
    theirs = load_checkpoint(tmp_path / "checkpoints" / f"step_{STEPS:06d}.pt")["model"]
    worst = max((mine[k] - theirs[k]).abs().max().item() for k in theirs)
    assert worst <= WEIGHT_TOLERANCE, f"weights differ by {worst:.2e}"


# ---------------------------------------------------------------------------- the recorded run


def test_recorded_run_agrees_with_its_metrics_and_the_page() -> None:
    """docs/generated/accelerate/ (tools/figures_accelerate.py) is a run of today's script."""
    text = (RECORDED / "train.txt").read_text()
    heldout = [r for r in read_metrics(RECORDED / "metrics.jsonl") if r["split"] == "heldout"]
    printed = [float(x) for x in re.findall(r"held-out loss (\d+\.\d+) \|", text)]
    assert printed == [round(r["loss"], 3) for r in heldout]
    assert "Accelerate: 2 processes (MULTI_CPU, backend gloo) | device cpu" in text
    assert "8 blocks per micro-batch x 1 accumulation step(s) x 2 processes = 16" in text
    assert "(identical)" in text and "runs/accelerate/checkpoints/step_000414.pt" in text
    # its step-1 shards are the ones today's data pipeline gives (micro-batches of 8)
    shards = [expected_shard(rank=r, step=0, micro=8, accum=1)[0] for r in range(PROCESSES)]
    assert f"rank 0 {shards[0]}, rank 1 {shards[1]}" in text
    # the page: "ends at 5.11, close to Lab 1's 5.07"
    lab1 = [
        r
        for r in read_metrics(ROOT / "docs/generated/lab1/metrics.jsonl")
        if r["split"] == "heldout"
    ]
    assert round(heldout[-1]["loss"], 2) == 5.11 and round(lab1[-1]["loss"], 2) == 5.07
    assert heldout[0]["loss"] == pytest.approx(lab1[0]["loss"], abs=1e-6)  # same initial weights


# ---------------------------------------------------------------------------- bad input


@pytest.fixture
def fresh_accelerate_state() -> Iterator[None]:
    """Accelerate keeps one process-wide state; reset it as its own AccelerateTestCase does."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--grad-accum-steps", "0"], "error: --grad-accum-steps must be a positive number, got 0"),
        (
            ["--global-batch-size", "-16"],
            "error: --global-batch-size must be a positive number, got -16",
        ),
        (["--epochs", "0"], "error: --epochs must be a positive number, got 0"),
        (["--precision", "fp8"], "error: unknown precision 'fp8': use one of fp32, bf16, fp16"),
        (
            ["--global-batch-size", "30", "--grad-accum-steps", "4"],
            "error: --global-batch-size 30 is not divisible by 1 processes x 4 accumulation "
            "steps = 4: use a multiple of 4, e.g. 28 or 32",
        ),
        (["--precision", "fp16"], "use --precision bf16"),
        (["--global-batch-size", "4000"], "no full step in an epoch of 3319 training samples"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    script: ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fresh_accelerate_state: None,
    args: list[str],
    message: str,
) -> None:
    out, logs = tmp_path / "run", tmp_path / "logs"
    argv = [*args, "--cpu", "--output-dir", str(out), "--log-dir", str(logs), "--no-progress"]
    assert run_cli(script.main, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err
    assert not out.exists() and not logs.exists()


def test_processes_that_do_not_see_each_other_are_refused(
    script: ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fresh_accelerate_state: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torchrun said 2 processes, but with no GPU and no --cpu Accelerate runs each alone."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    if torch.cuda.is_available():
        pytest.skip("with a GPU, Accelerate would try nccl instead")
    argv = ["--output-dir", str(tmp_path / "run"), "--log-dir", str(tmp_path / "logs")]
    assert run_cli(script.main, argv) == 2
    err = capsys.readouterr().err
    assert "add --cpu after the script" in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("environ", "refused"),
    [
        ({"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1"}, True),  # --cpu, N > 1
        ({"ACCELERATE_USE_CPU": "True"}, False),  # --cpu, one process on purpose
        ({"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "x", "OMPI_COMM_WORLD_SIZE": "2"}, False),
        ({"ACCELERATE_USE_CPU": "False", "MASTER_ADDR": "x", "WORLD_SIZE": "2"}, False),
        ({}, False),  # plain `python script.py`
    ],
)
def test_accelerate_launch_cpu_with_many_processes_is_refused(
    script: ModuleType, environ: dict[str, str], refused: bool
) -> None:
    from tinyscale.core.errors import UsageError

    if not refused:
        script.check_launch(environ)
        return
    with pytest.raises(UsageError, match=r"accelerate launch --multi_gpu --num_processes 2"):
        script.check_launch(environ)


def test_bad_input_through_the_real_cli(tmp_path: Path) -> None:
    """As a user runs it: stderr is exactly one line, even with Accelerate imported."""
    out = tmp_path / "run"
    cmd = [sys.executable, str(SCRIPT), "--cpu", "--precision", "fp16"]
    proc = subprocess.run(
        [*cmd, "--output-dir", str(out), "--log-dir", str(tmp_path / "logs")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr == (
        "error: fp16 autocast needs a GPU (on CPU Accelerate would silently train in fp32): "
        "use --precision bf16 or fp32\n"
    )
    assert not out.exists()
