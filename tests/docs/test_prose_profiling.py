"""Numbers in the prose of "Profiling and MFU" (docs/workflows/profiling.md) that no output
block shows as written. tests/tinyscale/workflows/test_profile_bench.py checks the benchmark
file's own arithmetic; this module reads the page's sentences and compares them with:

- the recorded benchmark (docs/generated/workflows/profile_bench.txt): the shares of the
  profile, the batch, and the words that judge them ("about a third", "not a fifth");
- the Lab model: its parameter tensors, its gradients' size, 12 L T d;
- the page's recorded outputs: AdamW's operators, dropout's extra memory;
- DDP's defaults in torch and in the course's bucket model, and the AdamW test's tolerance.
"""

from __future__ import annotations

import ast
import re

import pytest
import torch.distributed as dist
from torch.nn.parallel import distributed as ddp

from helpers import ROOT, fails_when_changed, prose, recorded_output, said
from tinyscale.comm.comm_model import DEFAULT_BUCKET_CAP_MB, DEFAULT_FIRST_BUCKET_MB
from tinyscale.core.config import load_model_config
from tinyscale.core.model import TinyTransformer

PAGE = "workflows/profiling.md"
BENCH = ROOT / "docs" / "generated" / "workflows" / "profile_bench.txt"
ADAMW_TEST = "tests/tinyscale/workflows/test_profiling.py"


def shares() -> dict[str, int]:
    """The profile's shares in the benchmark file: part -> percent."""
    found = re.findall(r"([a-z/_' ]+?) (\d+) %", BENCH.read_text().replace(",", ""))
    return {name.strip(): int(value) for name, value in found}


def constant_in(path: str, name: str) -> object:
    """A test file's module constant, read, not imported."""
    tree = ast.parse((ROOT / path).read_text())
    (value,) = [
        ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == name
    ]
    return value


def check_matmuls(text: str) -> None:
    said(text, r"A first look at this step's profile invites three guesses: the matmuls take "
               r"about a third of the time; dropout's random numbers take about a fifth")  # fmt: skip
    (matmuls,) = said(
        text, r"\*\*1\. Matmuls: about a third — true\.\*\* `aten::mm`, `aten::addmm` and "
        r"`aten::bmm` took (\d+) % of the self CPU time",
    )  # fmt: skip
    part = shares()
    assert int(matmuls) == part["matmuls"] and abs(part["matmuls"] - 100 / 3) <= 5
    head, attention = said(
        text, r"the loss\) took (\d+) %, more than attention \((\d+) %\)\. \*What it suggests:\* "
        r"a model this narrow spends most of its time outside the matmuls",
    )  # fmt: skip
    assert (int(head), int(attention)) == (part["embeddings/head"], part["attention"])
    assert part["matmuls"] < 50, "most of the time outside the matmuls"


def check_dropout_and_optimizer(text: str) -> None:
    bernoulli, dropout = said(
        text, r"Their random numbers took (\d+) % of the time in the benchmark's profile; "
        r"everything dropout does \(masks, the multiplies, their backward\) took (\d+) %\. "
        r"Not a fifth\.",
    )  # fmt: skip
    part = shares()
    assert (int(bernoulli), int(dropout)) == (part["dropout's bernoulli_"], part["dropout"])
    assert part["dropout"] <= 15, "not a fifth"
    (optimizer,) = said(text, r"The optimizer is (\d+) % of this step")
    assert int(optimizer) == part["optimizer"]
    batch, tokens = said(text, r"one thread, batch (\d+) × (\d+) tokens, every variant timed")
    assert f"batch {batch} x {tokens} tokens, 1 thread" in BENCH.read_text()


def check_adamw(text: str) -> None:
    called, tensors, each = said(
        text, r"The default loop calls (\d+) operators for the Lab model's (\d+) parameter "
        r"tensors, about (\d+) per tensor",
    )  # fmt: skip
    lines = recorded_output(PAGE, "for dropout, adamw in")
    assert f"optimizer: {called} ops called" in lines[0]
    assert int(tensors) == len(list(TinyTransformer(load_model_config()).parameters()))
    assert int(each) == round(int(called) / int(tensors))
    atol, steps = said(
        text, r"a test checks that it trains the same weights \(to (\de-\d) after (\d) steps\)"
    )
    assert float(atol) == constant_in(ADAMW_TEST, "ADAMW_ATOL")
    assert int(steps) == constant_in(ADAMW_TEST, "ADAMW_STEPS")


def check_buckets(text: str) -> None:
    kib, first = said(
        text, r"The Lab model's gradients are (\d+) KiB, under DDP's first\s+bucket \((\d+) MiB\)"
    )
    params = TinyTransformer(load_model_config()).num_parameters()
    assert int(kib) == round(4 * params / 2**10)  # fp32 gradients
    assert int(first) == DEFAULT_FIRST_BUCKET_MB == dist._DEFAULT_FIRST_BUCKET_BYTES / 2**20
    (default,) = said(text, r"On a real model \(hundreds of MB of gradients\) the default (\d+) MB")
    assert int(default) == DEFAULT_BUCKET_CAP_MB == ddp._DEFAULT_BUCKET_CAP_MB


def check_flop_counter(text: str) -> None:
    (short,) = said(text, r"With dropout 0 the counter comes out ([\d,]+) = 12 L T d short")
    cfg = load_model_config()
    lines = recorded_output(PAGE, "FlopCounterMode, dropout {dropout}")
    math, fused = (int(line.rsplit(" ", 1)[1].replace(",", "")) for line in lines[2:4])
    twelve_ltd = 12 * cfg.num_hidden_layers * cfg.max_position_embeddings * cfg.hidden_size
    assert int(short.replace(",", "")) == twelve_ltd == math - fused


def check_memory(text: str) -> None:
    (more,) = said(text, r"Dropout 0\.1 saves (\d+) % more: each mask")
    lines = recorded_output(PAGE, "print(memory_report(ProfileConfig(dropout=dropout))[0])")
    saved = [float(re.search(r"saved activations ([\d.]+) MiB", line)[1]) for line in lines]
    assert int(more) == round(100 * (saved[1] / saved[0] - 1))
    (doubles,) = said(text, r"Every saved tensor has a batch dimension: the extra memory (doubles)")
    lines = recorded_output(PAGE, "for batch in (4, 8):")
    extra = [float(re.search(r"difference ([\d.]+) MiB", line)[1]) for line in lines]
    assert {"doubles": 2}[doubles] == round(extra[1] / extra[0], 1)


CHECKS = [check_matmuls, check_dropout_and_optimizer, check_adamw, check_buckets,
          check_flop_counter, check_memory]  # fmt: skip


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_the_benchmark_the_model_and_the_runs(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_matmuls, "took 36 % of the self CPU time", "took 30 % of the self CPU time"),
        (check_matmuls, "took 37 %, more than attention (21 %)", "took 37 %, more than attention (12 %)"),
        (check_dropout_and_optimizer, "took 13 %. Not a fifth.", "took 20 %. Not a fifth."),
        (check_dropout_and_optimizer, "The optimizer is 7 %", "The optimizer is 9 %"),
        (check_dropout_and_optimizer, "batch 16 × 64 tokens", "batch 32 × 64 tokens"),
        (check_adamw, "28 parameter tensors", "30 parameter tensors"),
        (check_adamw, "(to 3e-5 after 3 steps)", "(to 1e-5 after 3 steps)"),
        (check_buckets, "663 KiB", "678 KiB"),
        (check_buckets, "the default 25 MB", "the default 50 MB"),
        (check_flop_counter, "98,304 = 12 L T d", "65,536 = 12 L T d"),
        (check_memory, "saves 57 % more", "saves 75 % more"),
    ],
)  # fmt: skip
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
