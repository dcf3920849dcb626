"""FSDP2 and HSDP (tinyscale.data_parallel.fsdp) against our ZeRO-3 and the formulas.

The runs themselves are the FSDP page's code blocks: CI executes them and compares their
output with the recorded text on the page, so the recorded numbers are those of a real run.
These tests read the recorded outputs and check each number against the formulas —
parity with our ZeRO-3 (fp32 within PARITY_TOLERANCE, bf16 within one bf16 step of the
loss), bytes held = 16Ψ/S, bytes sent = 3 (S-1)/S · 4Ψ (+ HSDP's all-reduce), the DCP
reload — and the bad input, without starting processes.
"""

import re

import pytest
import torch

from helpers import recorded_output
from tinyscale.core.config import preset
from tinyscale.core.errors import run_cli
from tinyscale.core.model import count_parameters
from tinyscale.data_parallel.fsdp import check_shard_size, local_bytes, main

PARITY_TOLERANCE = 1e-5  # fp32, as for our ZeRO against DDP
BF16_LOSS_STEP = 2**-5  # one bf16 step at losses in [4, 8): 8 bits of mantissa


def recorded(command: str) -> str:
    return "\n".join(recorded_output("week-2/fsdp.md", command))


def numbers(line: str) -> list[float]:
    return [float(n.replace(",", "")) for n in re.findall(r"\d[\d,]*\.?\d*(?:e[+-]\d+)?", line)]


def facts(command: str) -> dict:
    out = recorded(command)
    line = {k: next(x for x in out.splitlines() if x.startswith(k)) for k in
            ("losses", "fsdp", "max", "held", "sent")}  # fmt: skip
    sent = dict(
        re.findall(r"(all_gather_single|reduce_scatter_single|all_reduce) ([\d,]+)", line["sent"])
    )
    resumed = re.search(r"loss ([\d.]+) \(uninterrupted ([\d.]+)\)", out)
    return {
        "psi": int(re.search(r"Ψ = ([\d,]+)", out).group(1).replace(",", "")),
        "ours": numbers(line["losses"]),
        "fsdp": numbers(line["fsdp"]),
        "diff": numbers(line["max"])[-1],
        "held": numbers(line["held"].split(":", 1)[1]),  # after "held by rank 0:"
        "sent": {k: int(v.replace(",", "")) for k, v in sent.items()},
        "resumed": resumed and (float(resumed.group(1)), float(resumed.group(2))),
    }


FP32 = "python -m tinyscale.data_parallel.fsdp --world-size 2 --checkpoint-dir"
BF16 = "python -m tinyscale.data_parallel.fsdp --world-size 2 --precision bf16"
HSDP = "python -m tinyscale.data_parallel.fsdp --world-size 4 --shard-size 2"


def test_recorded_runs_use_the_zero_lessons_model() -> None:
    for command in (FP32, BF16, HSDP):
        assert facts(command)["psi"] == count_parameters(preset("tiny")) == 25_984


@pytest.mark.parametrize("command", [FP32, HSDP])
def test_fp32_fsdp_and_hsdp_equal_our_zero3(command) -> None:
    f = facts(command)
    assert f["diff"] <= PARITY_TOLERANCE
    assert f["fsdp"] == f["ours"]  # to the 4 printed decimals


def test_bf16_policy_stays_within_a_bf16_step_of_fp32() -> None:
    f = facts(BF16)
    assert 0 < f["diff"] < 1e-2, "bf16 compute changes the last bits of the update, not more"
    assert all(abs(a - b) <= BF16_LOSS_STEP for a, b in zip(f["fsdp"], f["ours"], strict=True))


@pytest.mark.parametrize(("command", "shard"), [(FP32, 2), (BF16, 2), (HSDP, 2)])
def test_bytes_held_are_16_psi_over_the_shard_group(command, shard) -> None:
    f = facts(command)
    weights, grads, optimizer, total = f["held"]
    psi = f["psi"]
    assert (weights, grads, optimizer) == (4 * psi / shard, 4 * psi / shard, 8 * psi / shard)
    assert total == 16 * psi / shard


@pytest.mark.parametrize(("command", "gather_bytes"), [(FP32, 4), (BF16, 2), (HSDP, 4)])
def test_bytes_sent_are_zero3s_3_passes(command, gather_bytes) -> None:
    """Two all-gathers (forward, backward) of the gathered dtype, one fp32 reduce-scatter,
    each (S-1)/S of the data over the shard group of S = 2; HSDP adds the all-reduce of
    the 1/S shard over R = 2 replicas: 2 (R-1)/R · 4Ψ/S."""
    f = facts(command)
    psi, s = f["psi"], 2
    assert f["sent"]["all_gather_single"] == 2 * (s - 1) / s * gather_bytes * psi
    assert f["sent"]["reduce_scatter_single"] == (s - 1) / s * 4 * psi
    if command == HSDP:
        r = 2
        assert f["sent"]["all_reduce"] == 2 * (r - 1) / r * 4 * psi / s
    else:
        assert "all_reduce" not in f["sent"]


@pytest.mark.parametrize("command", [FP32, HSDP])
def test_dcp_reload_continues_exactly(command) -> None:
    reloaded, uninterrupted = facts(command)["resumed"]
    assert reloaded == uninterrupted


def test_local_bytes_counts_a_plain_tensor_whole() -> None:
    assert local_bytes(torch.zeros(3, 5)) == 60
    assert local_bytes(torch.zeros(4, dtype=torch.bfloat16)) == 8


@pytest.mark.parametrize(("world", "shard", "expected"), [(4, None, 4), (4, 2, 2), (8, 4, 4)])
def test_shard_group_sizes(world, shard, expected) -> None:
    assert check_shard_size(world, shard) == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--world-size", "4", "--shard-size", "3"], "--shard-size 3 does not divide --world-size 4"),
     (["--world-size", "0"], "--world-size must be at least 1"),
     (["--world-size", "2", "--shard-size", "0"], "--shard-size 0 does not divide"),
     (["--precision", "fp16"], "--precision fp16 needs a loss scaler, which this run has not"),
     (["--precision", "fp8"], "unknown precision 'fp8': use one of fp32, bf16, fp16")],
)  # fmt: skip
def test_bad_input_is_one_line_before_any_process_starts(argv, message, capsys) -> None:
    assert run_cli(main, argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
