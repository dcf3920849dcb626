"""The Checkpoints page's sizes in prose are those of the demo model and its files.

The page's outputs (the ranked checkpoint of 2 ranks, the DCP files of 4 ranks) are compared
by CI; what the page says of them in its own words is read here and checked against them
and against the demo model of tinyscale.data_parallel.checkpoint_demo:

- a rank file: the weights in float32, the AdamW moments twice that, the state twice over
  on 2 ranks;
- DCP's files: their total, the weights they hold, the framing per tensor record.
"""

from __future__ import annotations

import re

import pytest
import torch

from helpers import fails_when_changed, prose, said
from tinyscale.core.config import preset
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel.checkpoint_demo import SHARDED, demo_params

PAGE = "workshop/checkpoints.md"


def number(text: str) -> int:
    return int(text.replace(",", ""))


def weight_bytes() -> int:
    """The demo model's parameters in float32 (the tied lm_head counted once)."""
    return sum(p.numel() * p.element_size() for p in demo_params().values())


def check_ranked_sizes(text: str) -> None:
    weights, moments, per_rank, total, twice = said(
        text,
        r"Each holds a full replica of the weights \(([\d,]+) bytes of float32\) and the AdamW "
        r"moments \((twice) that\), plus its own RNG state, data position and step, and the "
        r"model config: ([\d,]+) bytes per rank, ([\d,]+) in all — the state (twice), because "
        r"DDP keeps the replicas equal\.",
    )
    assert number(weights) == weight_bytes()
    # what AdamW keeps after a step: two moments per parameter, each the size of the weight
    torch.manual_seed(0)
    model = TinyTransformer(preset("micro"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.arange(16).view(2, 8)
    model(x, x)[1].backward()
    optimizer.step()
    kept = sum(
        t.numel() * t.element_size()
        for state in optimizer.state.values()
        for name, t in state.items()
        if name in ("exp_avg", "exp_avg_sq")
    )
    assert moments == "twice" and kept == 2 * number(weights)
    # the recorded run (compared by CI): one file per rank, each of the size the text says
    files = re.findall(r"rank (\d) wrote rank_\d+\.pt \(([\d,]+) bytes\)", text)
    assert {number(size) for _, size in files} == {number(per_rank)}
    assert twice == "twice" and len(files) == 2
    assert number(total) == len(files) * number(per_rank)


def check_dcp_sizes(text: str) -> None:
    framing, files, weights = said(
        text,
        r"small `torch\.save` record \(about ([\d.]+) kB of zip framing around its bytes: "
        r"([\d,]+) bytes of files for ([\d,]+) bytes of weights in this toy",
    )
    (world,) = said(
        text, r"path = \"runs/checkpoints/dcp_w4\".*?run_on_ranks\(dcp_save_worker, (\d+), path\)"
    )
    sizes = [number(s) for s in re.findall(r"__\d_0\.distcp ([\d,]+) bytes", text)]
    assert len(sizes) == int(world) and sum(sizes) == number(files)
    assert number(weights) == weight_bytes()
    # one record per replicated tensor, one per block of each sharded one
    records = len(demo_params()) - len(SHARDED) + int(world) * len(SHARDED)
    assert round((number(files) - number(weights)) / records / 1000, 1) == float(framing)


@pytest.mark.parametrize("check", [check_ranked_sizes, check_dcp_sizes])
def test_the_pages_sizes_are_those_of_the_demo(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_ranked_sizes, "(26,176 bytes of float32)", "(26,175 bytes of float32)"),
        (check_ranked_sizes, "bytes per rank, 205,504 in all", "bytes per rank, 205,505 in all"),
        (check_dcp_sizes, "about 1.6 kB of zip framing", "about 1.4 kB of zip framing"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
