"""code/tinyscale/compat/deepspeed_config.py: the shipped JSON files, checked by DeepSpeed's own parser,
and every bad config turned into one line that names the fix. In-process, no launch."""

import json
from pathlib import Path

import pytest

from tinyscale.compat.deepspeed_config import (
    DS_CONFIG_DIR,
    batch_sizes,
    load_ds_config,
    offloads,
    precision_of,
    shipped_configs,
    skip_unused_shm_build,
    with_precision,
    zero_stage,
)
from tinyscale.core.errors import UsageError

# What each file's name promises: (stage, precision, offloads)
SHIPPED = {
    "zero1.json": (1, "bf16", []),
    "zero2.json": (2, "bf16", []),
    "zero2_fp16.json": (2, "fp16", []),
    "zero2_offload.json": (2, "bf16", ["optimizer -> cpu"]),
    "zero3.json": (3, "bf16", []),
    "zero3_fp16.json": (3, "fp16", []),
    "zero3_offload.json": (3, "bf16", ["optimizer -> cpu", "param -> cpu"]),
    "zero3_offload_nvme.json": (3, "bf16", ["optimizer -> nvme", "param -> nvme"]),
}


def test_every_shipped_config_is_listed_here() -> None:
    assert shipped_configs() == sorted(SHIPPED)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_deepspeed_parses_each_config_as_its_name_says(name: str) -> None:
    """DeepSpeed's own parser (pydantic models, batch arithmetic, sanity checks) accepts
    the file unmodified; the offload configs are checked here only, never run on a CPU."""
    from deepspeed.runtime.config import DeepSpeedConfig

    config = load_ds_config(DS_CONFIG_DIR / name)
    assert config == json.loads((DS_CONFIG_DIR / name).read_text())  # "config": unchanged
    parsed = DeepSpeedConfig(config)  # no process group: DeepSpeed assumes world size 1
    stage, precision, moved = SHIPPED[name]
    assert parsed.zero_optimization_stage == stage == zero_stage(config)
    assert precision_of(config) == precision
    assert parsed.bfloat16_config.enabled == (precision == "bf16")
    assert parsed.float16_config.enabled == (precision == "fp16")
    assert offloads(config) == moved
    assert parsed.gradient_clipping == 1.0  # Lab 1's grad_clip
    assert parsed.train_batch_size == 16 == batch_sizes(config, 1)[2]
    # ZeRO-Offload steps CPU partitions with DeepSpeed's CPU Adam: the JSON names it
    assert ("optimizer" in config) == bool(moved)
    if "optimizer" in config:
        assert parsed.optimizer_name == "adamw"
        assert parsed.optimizer_params["betas"] == [0.9, 0.95]


def test_zero3_partitions_every_tensor() -> None:
    """Threshold 0: no tensor is too small to split, so the memory arithmetic is exact."""
    from deepspeed.runtime.config import DeepSpeedConfig

    parsed = DeepSpeedConfig(load_ds_config(DS_CONFIG_DIR / "zero3.json"))
    assert parsed.zero_config.param_persistence_threshold == 0


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_precision_override_switches_exactly_one_on(precision: str) -> None:
    base = load_ds_config(DS_CONFIG_DIR / "zero2_fp16.json")
    config = with_precision(base, precision)
    assert precision_of(config) == precision
    assert config["fp16"]["loss_scale_window"] == 1000  # the fp16 block's settings survive
    assert precision_of(base) == "fp16"  # a copy: the loaded dict is not changed


@pytest.mark.parametrize(
    ("fields", "world", "want"),
    [
        ({"train_micro_batch_size_per_gpu": 16}, 2, (16, 1, 32)),
        ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 8, (4, 2, 64)),
        ({"train_batch_size": 64, "gradient_accumulation_steps": 2}, 4, (8, 2, 64)),
        ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8}, 2, (8, 4, 64)),
        ({"train_batch_size": 32}, 2, (16, 1, 32)),
    ],
)
def test_batch_sizes_follow_deepspeeds_rule(fields: dict, world: int, want: tuple) -> None:
    micro, accum, total = batch_sizes(fields, world)
    assert (micro, accum, total) == want and total == micro * accum * world


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "the config sets no batch size: add train_micro_batch_size_per_gpu"),
        ({"train_micro_batch_size_per_gpu": 0}, "must be a positive integer, got 0"),
        ({"train_micro_batch_size_per_gpu": 2.5}, "must be a positive integer, got 2.5"),
        ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 8}, "!= micro 8 x"),
    ],
)
def test_bad_batch_sizes(fields: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("+", r"\+").replace(".", r"\.")):
        batch_sizes(fields, 2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", "must hold a JSON object {...}, not list"),
        ('{"zero_optimization": {"stage": true}}', "unknown ZeRO stage True"),
        ('{"zero_optimization": {"stage": -1}}', "unknown ZeRO stage -1"),
        (
            '{"a": 1,}',
            "is not valid JSON (Expecting property name enclosed in double quotes at line 1, column 9)",
        ),
    ],
)
def test_bad_configs_are_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "ds.json"
    path.write_text(text)
    with pytest.raises(UsageError) as err:
        load_ds_config(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_unknown_precision() -> None:
    with pytest.raises(UsageError, match="unknown precision 'fp8': use one of fp32, bf16, fp16"):
        with_precision({}, "fp8")


def test_the_shm_op_is_marked_unbuildable_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the call, DeepSpeed's comm backend skips the JIT build and falls back to gloo."""
    import deepspeed.ops
    from deepspeed.comm.torch import build_shm_op

    table = dict(deepspeed.ops.__compatible_ops__)
    monkeypatch.setattr(deepspeed.ops, "__compatible_ops__", table)  # undone after the test
    assert table["deepspeed_shm_comm"] is True  # Linux + a compiler: DeepSpeed would build it
    assert skip_unused_shm_build() is True
    assert table["deepspeed_shm_comm"] is False
    assert build_shm_op() is None  # what DeepSpeed's TorchBackend calls at start-up


def test_deepspeed_reads_the_example_hostfile() -> None:
    """The `deepspeed --hostfile` parser: comments skipped, one node per line, its GPUs."""
    from deepspeed.launcher.runner import _parse_hostfile

    lines = (DS_CONFIG_DIR.parent / "hostfile.example").read_text().splitlines()
    assert dict(_parse_hostfile(lines)) == {"gpu-node-01": 8, "gpu-node-02": 8}


def test_the_gpu_batch_file_names_real_files() -> None:
    """The commented DeepSpeed launch in the SLURM example points at this lab's files."""
    root = DS_CONFIG_DIR.parents[2]
    text = (root / "code" / "config" / "slurm_example_gpu.sbatch").read_text()
    launch = text[text.index("# deepspeed --hostfile") :]
    for path in ("code/scripts/deepspeed_train.py", "code/config/deepspeed/zero3.json"):
        assert path in launch and (root / path).is_file()
    assert "--deepspeed-config" in launch and "<your" not in launch


def test_deepspeed_stays_optional() -> None:
    """`import tinyscale` and these modules work without DeepSpeed: it is imported on use."""
    import subprocess
    import sys

    code = (
        "import sys, tinyscale, tinyscale.compat.deepspeed_config, tinyscale.compat.deepspeed_costs; "
        "print('deepspeed' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout == "False\n"
