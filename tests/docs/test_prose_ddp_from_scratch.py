"""The numbers in the prose of docs/week-1/ddp-from-scratch.md, against the models, the code,
torch's DDP and the recorded benchmark (docs/generated/week1/ddp_bench.json):

- the parameter tensors and gradient bytes of the page's models (`preset("tiny")`, the
  default `ModelConfig()`, the benchmark's `preset("bench")`), counted;
- torch's bucket caps (25 MiB, a 1 MiB first bucket only by default), from torch itself;
- the parity run's 5 steps and `PARITY_TOLERANCE`, against the code and the compared output;
- the benchmark's bucket sizes and the buckets each cap makes, against the sweep's settings,
  `assign_buckets` and the page's compared output;
- "Torch's own two rows ... say the same", against the recording;
- the bug's 4 ranks and 4× step, and the buckets-by-hand exercise, byte for byte.
"""

from __future__ import annotations

import inspect
import json
import re

import pytest
import torch
import torch.distributed as dist
import torch.nn.parallel.distributed as torch_ddp

from helpers import ROOT, fails_when_changed, load_script, prose, recorded_output, said
from tinyscale.comm.comm_model import assign_buckets
from tinyscale.core.config import ModelConfig, preset
from tinyscale.core.memory import MiB
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel import ddp_buckets

PAGE = "week-1/ddp-from-scratch.md"
DEMO = "ddp_buckets import demo\ndemo(world_size=2)"  # the CPU tab, not the GPU one
BENCH = ROOT / "docs" / "generated" / "week1" / "ddp_bench.json"


def reversed_sizes(cfg: ModelConfig) -> list[tuple[str, int]]:
    """(name, bytes) of the model's parameters in reverse order of registration."""
    named = list(TinyTransformer(cfg).named_parameters())[::-1]
    return [(name, p.numel() * p.element_size()) for name, p in named]


def bench_rows() -> list[dict]:
    return json.loads(BENCH.read_text())


def check_naive_tensors(text: str) -> None:
    tensors, calls, floats = said(
        text,
        r"TinyTransformer has (\d+) parameter tensors, so (\d+) all-reduces per step — many of "
        r"them a LayerNorm weight or bias of (\d+) floats",
    )
    for cfg in (ModelConfig(), preset("tiny")):  # the default, and the demo's
        assert len(reversed_sizes(cfg)) == int(tensors) == int(calls)
    model = TinyTransformer(ModelConfig())
    norms = [
        p for m in model.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters()
    ]
    assert len(norms) >= 10 and {p.numel() for p in norms} == {int(floats)}
    assert "naive: 28 all-reduces/step" in recorded_output(PAGE, DEMO)[1]


def check_torch_caps(text: str) -> None:
    (default,) = said(text, r"\(torch's default: (\d+) MB, counted in MiB like torch\)")
    assert int(default) == torch_ddp._DEFAULT_BUCKET_CAP_MB
    (first,) = said(text, r"It also uses a small first bucket \((\d+) MiB, when `bucket_cap_mb`")
    (first_again,) = said(text, r"caps it at `dist\._DEFAULT_FIRST_BUCKET_BYTES`, (\d+) MiB — but")
    (torch_rows,) = said(text, r"Torch's own two rows, with and without its (\d+) MiB first bucket")
    assert int(first) * MiB == int(first_again) * MiB == int(torch_rows) * MiB
    assert int(first) * MiB == dist._DEFAULT_FIRST_BUCKET_BYTES
    explicit, explicit_first = said(
        text,
        r"an explicit `bucket_cap_mb=(\d+)` gives a first bucket of (\d+) MB like the others",
    )
    assert explicit == explicit_first
    source = inspect.getsource(torch_ddp)
    assert "dist._DEFAULT_FIRST_BUCKET_BYTES if is_using_default else bucket_bytes_cap" in source


def check_test_model(text: str) -> None:
    hidden, blocks, tensors, kb, cap, cap_bytes = said(
        text,
        r"The test model of this page \(hidden size (\d+), (\d+) blocks: (\d+) tensors, (\d+) KB "
        r"of gradients\) at `bucket_cap_mb=([\d.]+)` \(([\d,]+) bytes\)",
    )
    cfg = preset("tiny")
    assert (cfg.hidden_size, cfg.num_hidden_layers) == (int(hidden), int(blocks))
    sizes = reversed_sizes(cfg)
    assert len(sizes) == int(tensors) and round(sum(b for _, b in sizes) / 1000) == int(kb)
    assert int(float(cap) * MiB) == int(cap_bytes.replace(",", ""))


def check_parity_run(text: str) -> None:
    (steps,) = said(text, r"compare the weights after (\d+) steps:")
    (steps_again,) = said(text, r"after every one of the (\d+) steps, although every rank")
    default = inspect.signature(ddp_buckets.compare_with_torch_ddp).parameters["steps"].default
    assert int(steps) == int(steps_again) == default
    output = recorded_output(PAGE, DEMO)
    assert f", {steps} SGD steps," in output[0]
    (tolerance,) = said(text, r"within `PARITY_TOLERANCE` = ([\d.e-]+)\. With 2 ranks")
    assert float(tolerance) == ddp_buckets.PARITY_TOLERANCE
    assert f"< {ddp_buckets.PARITY_TOLERANCE:g}: True" in output[1]


def check_bench_model(text: str) -> None:
    hidden, blocks, millions, mb = said(
        text,
        r"trains a bigger TinyTransformer \(hidden size (\d+), (\d+) blocks, ([\d.]+) M "
        r"parameters: (\d+) MB of gradients\) on 2 ranks",
    )
    bench = load_script("bench_ddp", folder="benchmarks")
    cfg = bench.CFG
    assert (cfg.hidden_size, cfg.num_hidden_layers, bench.WORLD) == (int(hidden), int(blocks), 2)
    params = sum(p.numel() for p in TinyTransformer(cfg).parameters())
    assert round(params / 1e6, 1) == float(millions)
    assert round(params * 4 / MiB) == int(mb)
    assert {round(row["grad_mb"]) for row in bench_rows()} == {int(mb)}
    _, one_bucket = said(text, r"at (\d+) MB this model's (\d+) MB of gradients are one bucket")
    (copies,) = said(text, r"Every step reads and writes the whole (\d+) MB of gradients")
    _, no_overlap = said(text, r"At (\d+) MB, without it, the whole (\d+) MB goes in one")
    (second,) = said(text, r"the copy out\*\* of every step, and the second (\d+) MB of gradient")
    assert one_bucket == copies == no_overlap == second == mb


def check_sweep_caps(text: str) -> None:
    low, high = said(
        text, r"Tokens/s of our overlapped DDP for bucket sizes from ([\d.]+) MB to (\d+) MB"
    )
    caps = sorted({row["bucket_cap_mb"] for row in bench_rows() if row["kind"] == "overlapped"})
    assert (float(low), float(high)) == (caps[0], caps[-1])
    (default,) = said(text, r"torch's (\d+) MB default is tuned for GPU clusters")
    assert int(default) == torch_ddp._DEFAULT_BUCKET_CAP_MB
    small, large = said(
        text, r"at two bucket sizes of the sweep, (\d+) MB and torch's default of (\d+) MB;"
    )
    bench = load_script("bench_ddp", folder="benchmarks")
    assert bench.ABLATION_MB == (float(small), float(large))
    assert float(large) == torch_ddp._DEFAULT_BUCKET_CAP_MB
    ablated = {row["bucket_cap_mb"] for row in bench_rows() if row["kind"].startswith("views")}
    assert ablated == {float(small), float(large)}


def bucket_lines() -> dict[tuple[int, str], list[float]]:
    """(cap, first) -> bucket sizes in MB, from the page's compared output."""
    out = {}
    for line in recorded_output(PAGE, 'preset("bench")'):
        m = re.fullmatch(
            r"bucket_cap_mb=\s*(\d+), first_bucket_mb=(\w+): buckets of ([\d., ]+) MB", line
        )
        assert m, line
        out[int(m[1]), m[2]] = [float(x) for x in m[3].split(", ")]
    return out


def check_first_bucket(text: str) -> None:
    buckets = bucket_lines()
    cap, whole = said(text, r"At (\d+) MB, without it, the whole (\d+) MB goes in one all-reduce")
    assert len(buckets[int(cap), "None"]) == 1 and round(buckets[int(cap), "None"][0]) == int(whole)
    (weight,) = said(text, r"With it, the last block's `ffn\.down` weight \((\d+) MiB\) travels")
    cfg = preset("bench")
    sizes = reversed_sizes(cfg)
    first = assign_buckets([b for _, b in sizes], cap_bytes=int(cap) * MiB, first_cap_bytes=MiB)[0]
    last_block = cfg.num_hidden_layers - 1
    assert f"blocks.{last_block}.ffn.down.weight" in [sizes[i][0] for i in first]
    assert dict(sizes)[f"blocks.{last_block}.ffn.down.weight"] == int(weight) * MiB
    only, several = said(
        text,
        r"The first bucket\*\* can only matter at (\d+) MB, where it is the only overlap there "
        r"is \(at (\d+) MB the model has several buckets already",
    )
    assert len(buckets[int(only), "None"]) == 1 and len(buckets[int(several), "None"]) > 2


def check_torch_rows_agree(text: str) -> None:
    said(text, r"Torch's own two rows, with and without its \d+ MiB first bucket, say the same\.")
    (default,) = [row for row in bench_rows() if row["kind"] == "torch default"]
    quartiles = default["ratio_quartiles"]
    assert quartiles[1] <= 1 <= quartiles[3], "torch with and without: within the noise"


def check_bytes_per_parameter(text: str) -> None:
    bf16, fp32 = said(text, r"\((\d+) bytes per parameter in bf16, (\d+) in fp32\)")
    assert torch.tensor([], dtype=torch.bfloat16).element_size() == int(bf16)
    assert torch.tensor([], dtype=torch.float32).element_size() == int(fp32)


def check_forgotten_division(text: str) -> None:
    ranks, times = said(
        text,
        r"With SGD the update is the learning rate times the gradient: (\d+) "
        r"ranks, (\d+) times the step",
    )
    lines = recorded_output(PAGE, "update_size_ratio, optimizer=optimizer")
    (sgd,) = [line for line in lines if line.startswith("sgd:")]
    m = re.fullmatch(
        r"sgd: \|update with the bug\| / \|correct update\| = ([\d.]+) on (\d+) ranks", sgd
    )
    assert m and int(m[2]) == int(ranks) and round(float(m[1])) == int(times) == int(ranks)


def check_buckets_by_hand(text: str) -> None:
    """The exercise's bytes, per parameter, and the solution's sums, from the default model."""
    question = said(
        text,
        r"with `bucket_cap_mb=([\d.]+)` — ([\d,]+) bytes\. In reverse order of registration its "
        r"parameters are `ln_f` \(2 × ([\d,]+) bytes\), then per block from the last: "
        r"`ffn\.down` \(bias ([\d,]+), weight ([\d,]+)\), `ffn\.up` \(bias ([\d,]+), weight "
        r"([\d,]+)\), `ln2` \(2 × ([\d,]+)\), `attn\.proj` \(([\d,]+), ([\d,]+)\), `attn\.qkv` "
        r"\(([\d,]+), ([\d,]+)\), `ln1` \(2 × ([\d,]+)\); then `pos_emb` \(([\d,]+)\) and "
        r"`tok_emb` \(([\d,]+)\)\.",
    )
    cap, cap_bytes, *said_sizes = question
    assert int(float(cap) * MiB) == int(cap_bytes.replace(",", ""))
    size = dict(reversed_sizes(ModelConfig()))
    expected = [
        size["ln_f.bias"],
        size["blocks.1.ffn.down.bias"],
        size["blocks.1.ffn.down.weight"],
        size["blocks.1.ffn.up.bias"],
        size["blocks.1.ffn.up.weight"],
        size["blocks.1.ln2.bias"],
        size["blocks.1.attn.proj.bias"],
        size["blocks.1.attn.proj.weight"],
        size["blocks.1.attn.qkv.bias"],
        size["blocks.1.attn.qkv.weight"],
        size["blocks.1.ln1.bias"],
        size["pos_emb.weight"],
        size["tok_emb.weight"],
    ]
    assert [int(s.replace(",", "")) for s in said_sizes] == expected
    for block in (0, 1):  # both blocks alike, weights and biases of a norm alike
        for part in ("ffn.down", "ffn.up", "attn.proj", "attn.qkv", "ln1", "ln2"):
            for kind in ("weight", "bias"):
                assert size[f"blocks.{block}.{part}.{kind}"] == size[f"blocks.1.{part}.{kind}"]
    solution = said(
        text,
        r"Add up until the sum reaches ([\d,]+), then start a new bucket\. Bucket 0: "
        r"([\d,]+) \+ ([\d,]+) \+ ([\d,]+) \+ ([\d,]+) = ([\d,]+) after the FFN's bias, \+ "
        r"([\d,]+) = ([\d,]+): full after 6 tensors\. Bucket 1 crosses the block boundary: block "
        r"1's norms and attention \(([\d,]+)\), then block 0's `ffn\.down` bias and weight = "
        r"[\d,]+ \(10 tensors\)\.",
    )
    reach, *terms, partial, up_weight, full, attention = (int(s.replace(",", "")) for s in solution)
    assert reach == int(cap_bytes.replace(",", ""))
    assert terms == [
        2 * size["ln_f.bias"],
        size["blocks.1.ffn.down.bias"],
        size["blocks.1.ffn.down.weight"],
        size["blocks.1.ffn.up.bias"],
    ]
    assert partial == sum(terms) < reach and up_weight == size["blocks.1.ffn.up.weight"]
    assert full == partial + up_weight >= reach
    block1_attention = [f"blocks.1.{p}" for p in ("ln2", "attn.proj", "attn.qkv", "ln1")]
    assert attention == sum(size[f"{p}.{k}"] for p in block1_attention for k in ("weight", "bias"))
    (embedding,) = said(text, r"one tensor \(the embedding, ([\d,]+) bytes\) is never split")
    assert int(embedding.replace(",", "")) == size["tok_emb.weight"] > reach


CHECKS = [
    check_naive_tensors,
    check_torch_caps,
    check_test_model,
    check_parity_run,
    check_bench_model,
    check_sweep_caps,
    check_first_bucket,
    check_torch_rows_agree,
    check_bytes_per_parameter,
    check_forgotten_division,
    check_buckets_by_hand,
]


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_those_of_the_data(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_naive_tensors, "bias of 64 floats", "bias of 32 floats"),
        (check_torch_caps, "(torch's default: 25 MB,", "(torch's default: 10 MB,"),
        (check_test_model, "104 KB of gradients", "208 KB of gradients"),
        (
            check_parity_run,
            "compare the weights after 5 steps",
            "compare the weights after 3 steps",
        ),
        (check_bench_model, "4.2 M parameters", "4.8 M parameters"),
        (check_sweep_caps, "sweep, 5 MB and torch's", "sweep, 1 MB and torch's"),
        (check_first_bucket, "(at 5 MB the model", "(at 25 MB the model"),
        (
            check_bytes_per_parameter,
            "(2 bytes per parameter in bf16",
            "(4 bytes per parameter in bf16",
        ),
        (check_forgotten_division, "4 ranks, 4 times the step", "4 ranks, 2 times the step"),
        (check_buckets_by_hand, "`attn.qkv` (768, 49,152)", "`attn.qkv` (768, 49,512)"),
        (check_buckets_by_hand, "(67,584)", "(67,328)"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
