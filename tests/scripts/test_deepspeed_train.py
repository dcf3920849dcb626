"""code/scripts/deepspeed_train.py run for real: DeepSpeed's CPU accelerator, gloo, 2 processes.

Two torchrun launches (each about 15 s here), fp32 and dropout 0 so the run is
deterministic and comparable:

- ZeRO-3 for 3 steps (checkpoint at 3), then `--resume auto` to step 6: finite, falling
  loss; DeepSpeed's files (one shard per rank, `latest`) and ours; no C++ op JIT-built;
  the resumed run continues the metrics and the schedule.
- Its losses equal the Lab 1 single-process loop on the same 32-block batches (in-process):
  the shards of both ranks together are Lab 1's batch, and ZeRO changes no math.
- The memory each rank reports equals the ZeRO-3 arithmetic for fp32 weights.
- Bad input: the cases of tests/scripts/bad_inputs.py (test_bad_inputs.py); here the
  ones that need these runs' checkpoints, and the page's command through a real process.

ZeRO-1, ZeRO-2 and ZeRO-3 taking the same step is the loss column of the page's
`python -m tinyscale.compat.deepspeed_costs` block; ZeRO-2 training through this script, and a
resume across launchers, are the page's two laptop commands (all run by CI).
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from helpers import ROOT, load_script
from tinyscale.comm.launch import free_port
from tinyscale.core.errors import run_cli
from tinyscale.core.memory import human_bytes
from tinyscale.core.metrics import read_metrics

SCRIPT = ROOT / "code" / "scripts" / "deepspeed_train.py"
CONFIGS = ROOT / "code" / "config" / "deepspeed"
STEPS, HALF, WORLD = 6, 3, 2
# Lab 1 averages 32 losses in one process, ZeRO two means of 16 over gloo: rounding only.
LAB1_TOLERANCE = 1e-5  # nats, per step
NUM_PARAMS = 169_728  # the tiny transformer of code/config/config.json (checked below)


def torchrun(out: Path, config: str, *args: str) -> subprocess.CompletedProcess:
    """2 processes on a free port; an empty TORCH_EXTENSIONS_DIR shows nothing gets built."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(WORLD),
        "--master-port",
        str(free_port()),
        str(SCRIPT),
        "--deepspeed-config",
        str(CONFIGS / config),
        "--precision",
        "fp32",
        "--dropout",
        "0",
        "--checkpoint-every",
        str(HALF),
        "--log-every",
        "1",
        "--output-dir",
        str(out / "run"),
        "--log-dir",
        str(out / "logs"),
        *args,
    ]
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(out / "ext")}
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def zero3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("zero3")
    torchrun(out, "zero3.json", "--max-steps", str(HALF))  # "interrupted" after step 3
    torchrun(out, "zero3.json", "--max-steps", str(STEPS), "--resume", "auto")
    return out


def train_records(out: Path) -> list[dict]:
    return [r for r in read_metrics(out / "run" / "metrics.jsonl") if r["split"] == "train"]


def rank0_log(out: Path) -> str:
    return (out / "logs" / "rank_0" / "train.log").read_text()


# ---------------------------------------------------------------------------- the runs


def test_zero3_trains_and_writes_deepspeed_checkpoints(zero3: Path) -> None:
    losses = [r["loss"] for r in train_records(zero3)]
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.05  # nats: warmup is slow, but it learns
    log = rank0_log(zero3)
    assert "ZeRO-3 | fp32 | offload none | backend gloo | device cpu | world 2" in log
    assert "global batch 32 = micro 16 x accum 1 x world 2 | 103 steps per epoch" in log
    checkpoints = zero3 / "run" / "checkpoints"
    assert (checkpoints / "latest").read_text().strip() == f"step_{STEPS:06d}"
    for step in (HALF, STEPS):
        folder = checkpoints / f"step_{step:06d}"
        shards = sorted(p.name for p in folder.glob("*optim_states.pt"))
        assert shards == [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(WORLD)]
        sidecar = json.loads((folder / "tinyscale.json").read_text())
        assert sidecar["step"] == step and sidecar["zero_stage"] == 3
        assert sidecar["world_size"] == WORLD and sidecar["precision"] == "fp32"
    assert not (zero3 / "ext").exists(), "DeepSpeed JIT-built an op: training should need none"


def test_zero3_resumes_where_it_stopped(zero3: Path) -> None:
    log = rank0_log(zero3)
    resumed = zero3 / "run" / "checkpoints" / f"step_{HALF:06d}"
    assert f"resumed from {resumed} at step {HALF}" in log
    assert [r["step"] for r in train_records(zero3)] == list(range(1, STEPS + 1))
    summary = json.loads((zero3 / "run" / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["zero_stage"] == 3


def test_same_steps_as_lab1_single_process_loop(
    zero3: Path, tmp_path: Path, no_dropout_config: Path
) -> None:
    """Shard k of both ranks together is Lab 1's batch k of 32: the same losses, the same lr,
    before and after the resume."""
    lab1 = load_script("train_tiny_transformer")
    args = [
        "--config",
        str(no_dropout_config),
        "--global-batch-size",
        "32",
        "--max-steps",
        str(STEPS),
    ]
    assert (
        lab1.main([*args, "--device", "cpu", "--no-progress", "--output-dir", str(tmp_path)]) == 0
    )
    want = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "train"]
    for got, ref in zip(train_records(zero3), want, strict=True):
        assert got["loss"] == pytest.approx(ref["loss"], abs=LAB1_TOLERANCE), got["step"]
        assert got["lr"] == pytest.approx(ref["lr"], rel=1e-12)


def test_each_rank_holds_the_zero3_share(zero3: Path) -> None:
    """fp32 ZeRO-3: 4Ψ/N of weights; 12Ψ/N of optimizer state (an fp32 master copy + Adam's
    two moments: DeepSpeed keeps the master copy even when the weights are fp32)."""
    from tinyscale.core.config import load_model_config
    from tinyscale.core.model import TinyTransformer

    model = TinyTransformer(load_model_config(ROOT / "code" / "config" / "config.json"))
    assert sum(p.numel() for p in model.parameters()) == NUM_PARAMS
    weights, optimizer = 4 * NUM_PARAMS // WORLD, 12 * NUM_PARAMS // WORLD
    line = (
        f"this rank holds weights {human_bytes(weights)} + optimizer state {human_bytes(optimizer)}"
    )
    for rank in range(WORLD):
        assert line in (zero3 / "logs" / f"rank_{rank}" / "train.log").read_text()


# ---------------------------------------------------------------------------- bad input


@pytest.fixture
def script() -> ModuleType:
    return load_script("deepspeed_train")


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variables a launcher sets, for checks that fail before any process group exists."""
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_resume_refuses_another_world_or_stage(
    script: ModuleType, zero3: Path, one_rank: None, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = zero3 / "run" / "checkpoints" / f"step_{HALF:06d}"
    for config, this in (("zero3.json", "ZeRO-3 on 1"), ("zero2.json", "ZeRO-2 on 1")):
        argv = ["--deepspeed-config", str(CONFIGS / config), "--resume", str(folder)]
        assert run_cli(script.main, argv) == 2  # WORLD_SIZE=1; the checkpoint has 2 shards
        err = capsys.readouterr().err
        assert f"holds ZeRO-3 shards of 2 ranks, this run is {this}: relaunch with 2" in err


def test_resume_at_the_end_is_refused_before_joining(
    script: ModuleType,
    zero3: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Rank 0 of 2, alone: the check fails before the process group would wait for rank 1."""
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    folder = zero3 / "run" / "checkpoints" / f"step_{STEPS:06d}"
    argv = ["--deepspeed-config", str(CONFIGS / "zero3.json"), "--resume", str(folder)]
    assert run_cli(script.main, [*argv, "--max-steps", str(STEPS)]) == 2
    assert capsys.readouterr().err == (
        f"error: the checkpoint is at step {STEPS}, the end of this run: raise --max-steps "
        "to train further\n"
    )


def test_bad_input_through_the_real_cli_as_the_page_shows_it() -> None:
    """The page's command, as a user types it: exactly the page's line on stderr, exit 2."""
    page = (ROOT / "docs" / "workshop" / "deepspeed.md").read_text()
    block = page[page.index("```console\n$ RANK=0") :].split("```")[1].splitlines()
    command, error, status = block[1], block[2], block[4]
    assert command.endswith("--deepspeed-config code/config/deepspeed/zero4.json")
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    env["MASTER_PORT"] = "29500"  # never used: the check fails before any process group
    proc = subprocess.run(
        [sys.executable, "code/scripts/deepspeed_train.py", *command.split()[-2:]],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (proc.stderr, str(proc.returncode)) == (error + "\n", status)


def test_the_deepspeed_launcher_flag_is_accepted(script: ModuleType) -> None:
    """`deepspeed` appends --local_rank=N to the script's arguments."""
    args = script.parse_args(["--local_rank=1", "--deepspeed-config", "x.json"])
    assert args.local_rank == 1 and args.deepspeed_config == "x.json"


@pytest.fixture(scope="module")
def no_dropout_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = json.loads((ROOT / "code" / "config" / "config.json").read_text())
    config["dropout"] = 0.0
    return write(tmp_path_factory.mktemp("config") / "config.json", json.dumps(config))
