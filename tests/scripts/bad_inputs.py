"""The bad inputs of the distributed and the workflows scripts: every case, in one list.

Each case runs a script's ``main`` in this process, the way torchrun starts rank 0 (its
variables set, no process group: bad input is refused before any rank joins one), in a
folder of its own that ``make`` fills with what the cases need on disk. The rule for each
(ARCHITECTURE.md §3): exit code 2, one line on stderr that names the fix, and nothing
created. tests/scripts/test_bad_inputs.py checks every case against that rule and against
its row of the table on "How the course is tested"; tools/figures_bad_inputs.py runs the
same cases and writes that table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from helpers import ROOT, load_script
from tinyscale.core.checkpoint import save_checkpoint
from tinyscale.core.config import load_model_config
from tinyscale.core.errors import run_cli
from tinyscale.core.model import TinyTransformer

LAUNCHER = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
MODULES = {"planner": "tinyscale.composed.planner"}  # run with python -m, not a script


@dataclasses.dataclass(frozen=True)
class Case:
    script: str  # code/scripts/<script>.py, or a key of MODULES
    argv: tuple[str, ...]
    says: str  # what the line must say: the input, and the fix
    world: int | None = None  # rank 0 of this many, as torchrun starts it; None: no torchrun
    given: str = ""  # what is on disk before it runs, in words (``make`` puts it there)
    env: tuple[str, ...] = ()  # with world None: only these of torchrun's variables, "RANK=0"

    @property
    def command(self) -> str:
        """The command as a reader types it, from the repository root."""
        if self.script in MODULES:
            run = f"python -m {MODULES[self.script]}"
        elif self.world is None:
            run = f"python code/scripts/{self.script}.py"
        else:
            run = f"torchrun --nproc-per-node {self.world} code/scripts/{self.script}.py"
        return " ".join([*self.env, run, *self.argv])


LAB1_PT = ("runs/lab1/step_000000.pt",)  # the Lab model, untrained: a Lab 1 checkpoint
LAB1 = ("--base", *LAB1_PT)
ZERO2 = ("--deepspeed-config", "code/config/deepspeed/zero2.json")  # shipped: make copies it
MICRO = "--microbatches must be a whole number >= 1, got "
# fmt: off
CASES = [
    # Lab 2: data parallelism from scratch
    Case("ddp_simulation_train", ("--global-batch-size", "30"), "use a multiple of 4", world=4),
    Case("ddp_simulation_train", ("--global-batch-size", "8192"),
         "4096 processes but only 3319 training samples: every rank needs at least one",
         world=4096),
    Case("ddp_simulation_train", (), "not launched by torchrun"),
    Case("ddp_simulation_train", (), "MASTER_ADDR and MASTER_PORT not set: export MASTER_ADDR",
         env=("RANK=0", "WORLD_SIZE=1")),
    Case("ddp_simulation_train", ("--precision", "fp16", "--device", "cpu"),
         "fp16 needs a CUDA GPU (device is cpu); use bf16 on CPU", world=1),
    Case("ddp_simulation_train", ("--fail-rank", "2", "--fail-step", "5"),
         "--fail-rank 2 is outside the world: ranks are 0..1", world=2),
    Case("ddp_simulation_train", ("--fail-rank", "1", "--fail-step", "0"),
         "--fail-step 0 never comes", world=2),
    Case("ddp_simulation_train", ("--hang-rank", "1", "--hang-step", "-1"),
         "--hang-step -1 never comes", world=2),
    Case("ddp_simulation_train", ("--output-dir", "runs/blocked"), "checkpoints is a file",
         world=1, given="runs/blocked/checkpoints is a file"),
    Case("ddp_simulation_train", ("--output-dir", "runs/old-run"), "summary.json is a folder",
         world=1, given="runs/old-run/summary.json is a folder"),
    # Week 2: DeepSpeed and Accelerate
    Case("deepspeed_train", ("--deepspeed-config", "code/config/deepspeed/zero4.json"),
         "not found: use one of code/config/deepspeed/ (", world=1),
    Case("deepspeed_train", ("--deepspeed-config", "runs/ds/broken.json"),
         "is not valid JSON (Expecting property name", world=1,
         given="runs/ds/broken.json holds {broken"),
    Case("deepspeed_train", ("--deepspeed-config", "runs/ds/stage4.json"),
         "unknown ZeRO stage 4: set", world=1, given='runs/ds/stage4.json sets "stage": 4'),
    Case("deepspeed_train", ("--deepspeed-config", "runs/ds/stage-text.json"),
         "unknown ZeRO stage '2'", world=1, given='runs/ds/stage-text.json sets "stage": "2"'),
    Case("deepspeed_train", ("--deepspeed-config", "runs/ds/batch30.json"), "!= micro 16",
         world=1, given="runs/ds/batch30.json sets train_batch_size 30, micro-batch 16"),
    Case("deepspeed_train", ("--deepspeed-config", "code/config/deepspeed/zero2_fp16.json"),
         "fp16 training needs a GPU: on a CPU use --precision bf16", world=1),
    Case("deepspeed_train", (*ZERO2, "--precision", "fp8"),
         "unknown precision 'fp8': use one of fp32, bf16, fp16", world=1),
    Case("deepspeed_train", (*ZERO2, "--dropout", "1.5"), "--dropout must be in [0, 1)", world=1),
    Case("deepspeed_train", (*ZERO2, "--resume", "runs/nowhere"),
         "is not a checkpoint of this script", world=1),
    Case("deepspeed_train", (*ZERO2, "--output-dir", "runs/old-run"), "summary.json is a folder",
         world=1, given="runs/old-run/summary.json is a folder"),
    Case("deepspeed_train", (*ZERO2, "--output-dir", "runs/old-metrics"),
         "metrics.jsonl is a folder", world=1, given="runs/old-metrics/metrics.jsonl is a folder"),
    Case("accelerate_train", ("--cpu", "--output-dir", "runs/blocked"), "checkpoints is a file",
         given="runs/blocked/checkpoints is a file"),
    Case("accelerate_train", ("--cpu", "--output-dir", "runs/a-file/run"), "cannot be created",
         given="runs/a-file is a file"),
    Case("accelerate_train", ("--cpu", "--output-dir", "runs/old-tensorboard"),
         "tensorboard is a file", given="runs/old-tensorboard/tensorboard is a file"),
    Case("accelerate_train", ("--cpu", "--log-dir", "runs/logs"), "rank_0 is not a folder",
         given="runs/logs/rank_0 is a file"),
    Case("accelerate_train", ("--cpu", "--seed", "-1"), "--seed must be a whole number from 0"),
    # Week 3: the pipeline
    Case("pipeline_train", ("--pp", "3"), "--pp 3 does not divide the world of 2", world=2),
    Case("pipeline_train", ("--pp", "4"), "--pp 4 does not divide the world of 2", world=2),
    Case("pipeline_train", ("--pp", "0"), "give a whole number >= 1", world=2),
    Case("pipeline_train", ("--schedule", "zb1"), "--schedule 'zb1' is not known", world=2),
    Case("pipeline_train", ("--schedule", "interleaved"), "makes 4 stages", world=2),
    Case("pipeline_train", ("--microbatches", "0"), MICRO + "0", world=2),
    Case("pipeline_train", ("--microbatches", "-2"), MICRO + "-2", world=2),
    Case("pipeline_train", ("--microbatches", "3"), "does not divide the 16 samples", world=2),
    Case("pipeline_train", ("--microbatches", "3"), "does not divide the 8 samples", world=4),
    Case("pipeline_train", ("--log-dir", "runs/logs"), "rank_0 is not a folder", world=2,
         given="runs/logs/rank_0 is a file"),
    Case("pipeline_train", ("--resume", "runs/nowhere"),
         "checkpoint runs/nowhere not found: check the path, or pass --resume auto", world=2),
    Case("pipeline_train", ("--resume", "runs/a-file"),
         "checkpoint runs/a-file is a file, not a ranked checkpoint's folder", world=2,
         given="runs/a-file is a file"),
    # Week 4: any parallel shape
    Case("parallel_train", ("--tp", "2"), "--tp 2 gives 2 ranks but the job has 4", world=4),
    Case("parallel_train", ("--pp", "2", "--dp", "4"), "--pp 2 --dp 4 give 8 ranks but the job",
         world=4),
    Case("parallel_train", ("--dp", "0", "--tp", "4"), "--dp 0 is not a number of", world=4),
    Case("parallel_train", ("--tp", "3"), "does not divide the model's 4 attention", world=3),
    Case("parallel_train", ("--pp", "4"), "4 pipeline stages but the model has 2", world=4),
    Case("parallel_train", ("--dp", "3"), "does not split into dp x fsdp = 3", world=3),
    Case("parallel_train", ("--pp", "2", "--dp", "2", "--microbatches", "3"),
         "copies of 3 equal micro", world=4),
    Case("parallel_train", ("--pp", "2", "--microbatches", "0"), MICRO + "0", world=2),
    Case("parallel_train", ("--pp", "2", "--microbatches", "-2"), MICRO + "-2", world=2),
    Case("parallel_train", ("--dropout", "1"), "--dropout must be in [0, 1), got 1.0", world=1),
    Case("parallel_train", ("--resume", "runs/nowhere"), "runs/nowhere", world=1),
    Case("parallel_train", ("--output-dir", "runs/blocked"), "checkpoints is a file", world=1,
         given="runs/blocked/checkpoints is a file"),
    # Practical workflows: shards, evaluation, LoRA
    Case("prepare_shards", ("--shard-tokens", "1"), "--shard-tokens must be at least 2"),
    Case("prepare_shards", ("--corpus", "nope.txt"), "corpus 'nope.txt' is neither"),
    Case("prepare_shards", ("--out", "runs/a-file"), "runs/a-file is a file, where",
         given="runs/a-file is a file"),
    Case("prepare_shards", ("--out", "runs/old-shards"), "index.json is a folder, where",
         given="runs/old-shards/index.json is a folder"),
    Case("prepare_shards", ("--timeout-s", "0"), "--timeout-s must be a positive number"),
    Case("evaluate", ("runs/nowhere",), "checkpoint runs/nowhere not found: check the path"),
    Case("evaluate", ("runs/logs",), "runs/logs holds no checkpoint layout the course writes",
         given="runs/logs holds a file, rank_0"),
    Case("evaluate", ("runs/nowhere",), "checkpoint runs/nowhere not found", world=2),
    Case("evaluate", ("runs/torn.pt",), "runs/torn.pt is cut short", world=2,
         given="runs/torn.pt is a checkpoint cut short"),
    Case("evaluate", (*LAB1_PT, "--corpus", "nope.txt"), "corpus 'nope.txt' is neither", world=2,
         given="a Lab 1 checkpoint"),
    Case("evaluate", (*LAB1_PT, "--temperature", "-1"),
         "need --max-new-tokens >= 0, --top-k >= 0", given="a Lab 1 checkpoint"),
    Case("evaluate", (*LAB1_PT, "--global-batch-size", "0"),
         "--global-batch-size must be a positive number", given="a Lab 1 checkpoint"),
    Case("evaluate", (*LAB1_PT, "--report", "runs/a-file/report.json"), "cannot be created",
         given="a Lab 1 checkpoint; runs/a-file is a file"),
    Case("evaluate", (*LAB1_PT, "--report", "runs/old-report.json"),
         "runs/old-report.json is a folder, where the run writes a file",
         given="a Lab 1 checkpoint; runs/old-report.json is a folder"),
    Case("finetune_lora", ("--base", "runs/nowhere.pt"), "--base runs/nowhere.pt not found"),
    Case("finetune_lora", ("--base", "runs/dcp/step_000004"), "is a folder of DCP shards",
         given="a DCP checkpoint"),
    Case("finetune_lora", ("--base", "runs/lab1"), "e.g. runs/lab1/step_000000.pt",
         given="a folder of Lab 1 checkpoints"),
    Case("finetune_lora", ("--base", "runs/torn.pt"), "is corrupt or not a tinyscale checkpoint",
         given="runs/torn.pt is a checkpoint cut short"),
    Case("finetune_lora", (*LAB1, "--output-dir", "runs/a-file/lora"), "cannot be created",
         given="runs/a-file is a file"),
    Case("finetune_lora", (*LAB1, "--output-dir", "runs/old-lora"), "adapter.pt is a folder",
         given="runs/old-lora/adapter.pt is a folder"),
    Case("finetune_lora", (*LAB1, "--rank", "0"), "LoRA rank must be a whole number >= 1"),
    Case("finetune_lora", (*LAB1, "--rank", "65"), "use a rank from 1 to 64"),
    Case("finetune_lora", (*LAB1, "--targets", "attn.q"), "LoRA target 'attn.q' matches no"),
    Case("finetune_lora", (*LAB1, "--targets", "lm_head"), "(tied embeddings)"),
    # Week 4: the planner
    Case("planner", ("--gpus", "12", "--global-batch", "64"), "sizes (3, 6, 12) do not divide"),
    Case("planner", ("--gpus", "16", "--global-batch", "64", "--seq-len", "-5"),
         "--seq-len must be a whole number >= 1, got -5"),
    Case("planner", ("--gpus", "16", "--global-batch", "64", "--top", "0"),
         "--top must be a whole number >= 1, got 0"),
    Case("planner", ("--gpus", "0", "--global-batch", "64"), "--gpus must be"),
    Case("planner", ("--gpus", "16", "--gpus-per-node", "0", "--global-batch", "64"),
         "--gpus-per-node must be"),
    Case("planner", ("--gpus", "16", "--memory-gb", "0", "--global-batch", "64"),
         "--memory-gb must be a positive number"),
    Case("planner", ("--gpus", "16", "--global-batch", "0"), "--global-batch must be"),
    Case("planner", ("--model", "70b", "--gpus", "8", "--seq-len", "8192", "--global-batch", "8"),
         "no layout fits in 80 GB x 0.85; the smallest needs"),
]
# fmt: on


def make(folder: Path) -> None:
    """What the cases find on disk, in their working folder (every ``given``), and the
    shipped DeepSpeed configs, at their place in the repository."""
    runs = folder / "runs"
    for made in ("lab1", "dcp/step_000004", "old-lora/adapter.pt", "old-shards/index.json",
                 "blocked", "logs", "ds", "old-run/summary.json", "old-metrics/metrics.jsonl",
                 "old-tensorboard", "old-report.json"):  # fmt: skip
        (runs / made).mkdir(parents=True)
    for blocker in ("a-file", "blocked/checkpoints", "logs/rank_0", "old-tensorboard/tensorboard"):
        (runs / blocker).write_text("")
    (runs / "dcp" / "step_000004" / ".metadata").write_text("")  # DCP's, written last
    for name, text in (("broken", "{broken"), ("stage4", '{"zero_optimization": {"stage": 4}}'),
                       ("stage-text", '{"zero_optimization": {"stage": "2"}}'),
                       ("batch30", '{"train_batch_size": 30, "train_micro_batch_size_per_gpu": 16}')):  # fmt: skip
        (runs / "ds" / f"{name}.json").write_text(text)
    shutil.copytree(
        ROOT / "code" / "config" / "deepspeed", folder / "code" / "config" / "deepspeed"
    )
    cfg = load_model_config()
    state = {"model": TinyTransformer(cfg).state_dict(), "model_config": dataclasses.asdict(cfg),
             "train_config": None, "step": 0}  # fmt: skip
    base = save_checkpoint(state, runs / "lab1" / "step_000000.pt")
    (runs / "torn.pt").write_bytes(base.read_bytes()[:1000])  # a copy killed halfway


def entry(script: str) -> Callable[[Sequence[str] | None], int]:
    if script in MODULES:
        return __import__(MODULES[script], fromlist=["main"]).main
    return load_script(script).main


@contextlib.contextmanager
def launched(case: Case, folder: Path) -> Iterator[None]:
    """In ``folder``, with the variables torchrun gives rank 0 of ``case.world`` (None:
    none, or only ``case.env``)."""
    saved, cwd = {k: os.environ.get(k) for k in LAUNCHER}, os.getcwd()
    for key in LAUNCHER:
        os.environ.pop(key, None)
    if case.world is not None:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(case.world),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT="1")  # fmt: skip
    os.environ.update(variable.split("=", 1) for variable in case.env)
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(cwd)
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value


def files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def run(case: Case, folder: Path) -> tuple[int | None, str, list[str]]:
    """Run ``case`` in ``folder`` (made by ``make``): its exit code, what it wrote on stderr
    (paths under the folder or the repository as the reader sees them, relative), and the
    paths it created there."""
    before = files(folder)
    err, out = io.StringIO(), io.StringIO()
    with launched(case, folder), redirect_stderr(err), redirect_stdout(out):
        code = run_cli(entry(case.script), list(case.argv))
    text = err.getvalue()
    for prefix in (folder.resolve(), folder, ROOT):
        text = text.replace(f"{prefix}/", "")
    created = [p for p in files(folder) if p not in before]
    return code, text, created
