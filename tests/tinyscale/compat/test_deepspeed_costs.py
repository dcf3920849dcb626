"""tinyscale.compat.deepspeed_costs: what DeepSpeed's engines hold and move, counted.

The formulas are tinyscale.data_parallel.memory_calculator's (tested there), the counter is
tinyscale.comm.counter's (tested there). The numbers counted in real engines are the page's
`python -m tinyscale.compat.deepspeed_costs` block (docs/workshop/deepspeed.md), which fails
when an engine holds other bytes, or moves other traffic, than the formulas say;
test_deepspeed_train checks the fp32 ZeRO-3 share a training run reports."""

import pytest
import torch

from helpers import ROOT
from tinyscale.compat.deepspeed_costs import main, shared_fraction
from tinyscale.core.config import load_model_config
from tinyscale.core.errors import run_cli
from tinyscale.core.model import TinyTransformer


def test_the_tied_embedding_is_the_shared_part_of_the_tiny_model() -> None:
    model = TinyTransformer(load_model_config(ROOT / "code" / "config" / "config.json"))
    embedding = model.tok_emb.weight.numel()
    assert model.lm_head.weight is model.tok_emb.weight
    assert shared_fraction(model) == embedding / sum(p.numel() for p in model.parameters())
    assert shared_fraction(torch.nn.Linear(4, 4)) == 0.0


def test_bad_world_size_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(main, ["--world-size", "1"]) == 2
    assert capsys.readouterr().err == (
        "error: --world-size 1: use 2 to 8 processes on one machine\n"
    )
