"""code/tinyscale/compat/deepspeed_costs.py: the paper's bytes and traffic, and the counter that measures
traffic. The same numbers counted in real engines are the page's `python -m
tinyscale.compat.deepspeed_costs` block (docs/workshop/deepspeed.md), which fails when an engine
holds other bytes, or moves other traffic, than these say; test_deepspeed_train checks the
fp32 ZeRO-3 share a training run reports."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers import ROOT
from tinyscale.compat.deepspeed_costs import (
    TrafficCounter,
    main,
    shared_fraction,
    zero_bytes,
    zero_traffic,
)
from tinyscale.core.config import load_model_config
from tinyscale.core.errors import UsageError, run_cli
from tinyscale.core.memory import model_state_bytes
from tinyscale.core.model import TinyTransformer

PSI = 7_000_000_000  # a 7B model, the paper's running example size


@pytest.mark.parametrize(
    ("stage", "per_param"),
    [
        (0, 2 + 2 + 12),  # 16 Ψ: what plain data parallelism keeps on every GPU
        (1, 2 + 2 + 12 / 64),  # 4Ψ + 12Ψ/N
        (2, 2 + (2 + 12) / 64),  # 2Ψ + 14Ψ/N
        (3, 16 / 64),  # 16Ψ/N
    ],
)
def test_zero_bytes_per_rank_on_64_gpus(stage: int, per_param: float) -> None:
    got = zero_bytes(PSI, stage=stage, world_size=64)
    assert got.total == pytest.approx(per_param * PSI, rel=1e-9)


def test_stage_0_is_the_mixed_precision_estimate_of_session_a() -> None:
    assert zero_bytes(PSI, stage=0, world_size=8) == model_state_bytes(PSI, "bf16")


def test_one_rank_saves_nothing() -> None:
    assert {zero_bytes(10**6, stage=s, world_size=1).total for s in range(4)} == {16 * 10**6}


@pytest.mark.parametrize(("stage", "world"), [(4, 2), (-1, 2), (1, 0)])
def test_bad_stage_or_world(stage: int, world: int) -> None:
    with pytest.raises(UsageError, match="need a ZeRO stage 0-3 and world_size >= 1"):
        zero_bytes(100, stage=stage, world_size=world)


def test_traffic_paper_values() -> None:
    assert [zero_traffic(s) for s in range(4)] == [2, 2, 2, 3]
    assert zero_traffic(3, shared=0.25) == 3.5  # a quarter of Ψ gathered twice per pass


def test_the_tied_embedding_is_the_shared_part_of_the_tiny_model() -> None:
    model = TinyTransformer(load_model_config(ROOT / "code" / "config" / "config.json"))
    embedding = model.tok_emb.weight.numel()
    assert model.lm_head.weight is model.tok_emb.weight
    assert shared_fraction(model) == embedding / sum(p.numel() for p in model.parameters())
    assert shared_fraction(torch.nn.Linear(4, 4)) == 0.0


def test_the_counter_adds_what_each_collective_moves(tmp_path: Path) -> None:
    """One gloo process in this process: the counted sizes, by the paper's rule."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    counter = TrafficCounter()
    try:
        dist.all_reduce(torch.ones(10))  # not counted yet
        counter.counting = True
        dist.all_reduce(torch.ones(10))  # 2 x 10: reduce-scatter + all-gather
        dist.all_gather_into_tensor(torch.empty(6), torch.ones(6))  # the gathered 6
        dist.reduce_scatter_tensor(output=torch.empty(3), input=torch.ones(3))  # the 3 in
        dist.broadcast(torch.ones(4), src=0)
        assert counter.elements == 20 + 6 + 3 + 4
        assert counter.calls == {
            "all_reduce": 1,
            "all_gather_into_tensor": 1,
            "reduce_scatter_tensor": 1,
            "broadcast": 1,
        }
    finally:
        counter.remove()
        dist.destroy_process_group()
    assert dist.all_reduce is counter.originals["all_reduce"]


def test_bad_world_size_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(main, ["--world-size", "1"]) == 2
    assert capsys.readouterr().err == (
        "error: --world-size 1: use 2 to 8 processes on one machine\n"
    )
