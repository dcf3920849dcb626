"""Session B's run- and model-derived words and numbers that tests/docs/test_prose.py does
not read (issue 13: numbers in prose come from data). That module compares the fused
kernels' speed-ups with docs/generated/session_b/fused_kernels.txt; this one checks:

- "`foreach` is no faster here", against the same recorded run;
- the alpha-beta figure's caption: the ring's latency steps and how much the tree wins by
  for small messages, from the model the figure plots (tinyscale.comm.comm_model);
- accumulation: "a quarter of the activation memory", against the peaks the page's own
  expected output records (compared with a fresh run by `pytest --codeblocks`), and
  "about 8×" against docs/generated/session_b/accumulation_memory.json;
- the ring's latency steps, the bytes of the exercises and of "8 to 64 GPUs", from the
  model (tinyscale.comm.comm_model);
- DDP's bucket caps (the constants the bucket tests compare with DDP itself);
- the 16-bit formats (torch.finfo) and the loss scaler's factors (its defaults, torch's
  GradScaler's, the page's own compared output, the parity test's run);
- the linear scaling rule's learning rates (tinyscale.core.accumulation.scaled_lr).
"""

from __future__ import annotations

import inspect
import json
import math
import re

import pytest
import torch
from torch import nn

from helpers import ROOT, fails_when_changed, prose, said
from tinyscale.comm.comm_model import (
    DEFAULT_BUCKET_CAP_MB,
    DEFAULT_FIRST_BUCKET_MB,
    allreduce_time,
    ddp_bucket_plan,
    ring_allreduce_bytes,
    ring_allreduce_steps,
    tree_allreduce_bytes,
    tree_allreduce_steps,
)
from tinyscale.core.accumulation import scaled_lr
from tinyscale.core.precision import DynamicLossScaler

PAGE = "workshop/session-b.md"
FUSED = ROOT / "docs" / "generated" / "session_b" / "fused_kernels.txt"


def recorded_speedups() -> dict[str, float]:
    """Variant (its first words, up to the parenthesis) -> the speed-up column."""
    rows = re.findall(r"^(.+?) \(.*?\)\s+[\d,]+\s+([\d.]+)x$", FUSED.read_text(), re.M)
    return {name: float(x) for name, x in rows}


def check_foreach(text: str) -> None:
    """The fused kernels' speed-ups are compared in tests/docs/test_prose.py; this is the rest."""
    said(text, r"`foreach` is no faster here: on a CPU its multi-tensor ops are a loop")
    recorded = recorded_speedups()
    assert recorded["AdamW foreach=False"] == 1.0, "the baseline"
    assert recorded["AdamW foreach=True"] <= 1.0, "no faster"


def check_alpha_beta_caption(text: str) -> None:
    steps, wins = said(
        text,
        r"for small messages the ring's (\d+) latency steps dominate and the tree wins by (\d+)×",
    )
    # the right panel of session_b/allreduce.png: 256 GPUs, 5 µs, 25 GB/s
    link = dict(world_size=256, alpha_s=5e-6, bandwidth_bps=25e9)
    assert int(steps) == ring_allreduce_steps(256)
    smallest = 2**10  # the figure's first message size
    ratio = allreduce_time("ring", size_bytes=smallest, **link) / allreduce_time(
        "tree", size_bytes=smallest, **link
    )
    assert int(wins) == round(ratio, -1)


def check_accumulation(text: str) -> None:
    (fraction,) = said(
        text, r"Same loss, same gradient, (a quarter|a half|an eighth) of the activation memory"
    )
    whole, micro = (float(x) for x in re.findall(r"peak activations ([\d.]+) MiB", text))
    share = {"a half": 2, "a quarter": 4, "an eighth": 8}[fraction]
    assert round(whole / micro, 1) == share


def check_accumulation_ratio(text: str) -> None:
    (times,) = said(
        text,
        r"Accumulating 8 micro-batches of 4 instead of 1 batch of 32: which memory shrinks\?\" "
        r"Only the activations, about (\d+)×\.",
    )
    data = json.loads(
        (ROOT / "docs" / "generated" / "session_b" / "accumulation_memory.json").read_text()
    )
    peak = dict(zip(data["micro_batches"], data["peak_activations_mib"], strict=True))
    assert int(times) == round(peak[32] / peak[4])


def check_ring_latency(text: str) -> None:
    """1,024 GPUs: the ring's steps, and its latency against a 1 MB bucket's transfer (the
    alpha and beta of the figure: 5 µs, 25 GB/s); the tree's steps."""
    gpus, steps, megabytes, tree, again = said(
        text,
        r"For ([\d,]+) GPUs that is ([\d,]+) steps — for a (\d+) MB bucket, the latency dwarfs "
        r"the transfer\. A tree reduces up to a root and broadcasts back down in 2 log₂ N "
        r"steps: (\d+) for ([\d,]+) GPUs\.",
    )
    n = int(gpus.replace(",", ""))
    assert again == gpus
    assert int(steps.replace(",", "")) == ring_allreduce_steps(n)
    assert int(tree) == tree_allreduce_steps(n)
    latency = ring_allreduce_steps(n) * 5e-6
    transfer = ring_allreduce_bytes(size_bytes=int(megabytes) * 1e6, world_size=n) / 25e9
    assert latency > 10 * transfer, "dwarfs"


def check_exercise_bytes(text: str) -> None:
    billions, gpus = said(
        text, r"A ([\d.]+)-billion-parameter model trains with bf16 gradients on (\d+) GPUs\."
    )
    (b, per_elem, size, two, n, size_again, ring, tree, tree_steps, ring_steps) = said(
        text,
        r"S = ([\d.]+) × 10⁹ × (\d) bytes = ([\d.]+) GB\. Ring: (\d) · \d/(\d) · ([\d.]+) GB = "
        r"([\d.]+) GB per GPU; tree: about 2S = ([\d.]+) GB for the busiest GPU — a little "
        r"more, in (\d+) steps instead of (\d+)\.",
    )
    world = int(gpus)
    assert b == billions and int(n) == world and int(two) == 2 and size_again == size
    assert int(per_elem) == torch.finfo(torch.bfloat16).bits // 8
    S = float(b) * 1e9 * int(per_elem)
    assert float(size) == round(S / 1e9, 1)
    assert float(ring) == round(ring_allreduce_bytes(size_bytes=S, world_size=world) / 1e9, 2)
    assert float(tree) == round(tree_allreduce_bytes(size_bytes=S, world_size=world) / 1e9, 1)
    assert (int(tree_steps), int(ring_steps)) == (
        tree_allreduce_steps(world),
        ring_allreduce_steps(world),
    )
    small, large, steps8, steps64 = said(
        text,
        r"Barely: 2 · 7/8 · S = ([\d.]+) S becomes 2 · 63/64 · S ≈ ([\d.]+) S\. What grows is "
        r"the number of steps, (\d+) to (\d+)",
    )
    assert float(small) == ring_allreduce_bytes(size_bytes=1, world_size=8)
    assert float(large) == round(ring_allreduce_bytes(size_bytes=1, world_size=64), 2)
    assert (int(steps8), int(steps64)) == (ring_allreduce_steps(8), ring_allreduce_steps(64))


def check_buckets(text: str) -> None:
    """DDP's caps: tinyscale's constants, which tests/tinyscale/comm/test_comm_model.py
    compares with the buckets DDP really builds."""
    (default,) = said(text, r"`bucket_cap_mb` \((\d+) MiB by default\)")
    (first,) = said(text, r"The first bucket is kept small \((\d+) MiB\): the last layer's")
    asked, bigger = said(
        text,
        r"Why is DDP's first bucket only (\d+) MiB\?\" .*? a (\d+) MiB first bucket would wait",
    )
    layers, layer_mib, first_cap, cap = said(
        text,
        r"on a model of (\d+) × (\d+) MiB layers: the first bucket holds only the last layer "
        r"\((\d+) MiB cap\), the second the other seven \((\d+) MiB cap\)",
    )
    assert int(first) == int(asked) == int(first_cap) == DEFAULT_FIRST_BUCKET_MB
    assert int(default) == int(bigger) == int(cap) == DEFAULT_BUCKET_CAP_MB
    model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(int(layers))])
    assert model[0].weight.numel() * 4 == int(layer_mib) * 2**20
    buckets = ddp_bucket_plan(list(reversed(list(model.named_parameters()))))
    last = str(int(layers) - 1)
    assert [sorted({n.split(".")[0] for n in b}) for b in buckets] == [
        [last],
        [str(i) for i in range(int(layers) - 1)],
    ]


def check_formats(text: str) -> None:
    bits16, share, bits32 = said(
        text,
        r"Mixed precision runs the expensive operations in (\d+) bits — (half) the memory "
        r"traffic, .*? and keeps the sensitive ones in (\d+) bits\.",
    )
    fp16, bf16, fp32 = (torch.finfo(d) for d in (torch.float16, torch.bfloat16, torch.float32))
    assert int(bits16) == fp16.bits == bf16.bits and int(bits32) == fp32.bits
    assert share == "half" and fp16.bits / fp32.bits == 0.5

    def exponent_mantissa(f: torch.finfo) -> tuple[int, int]:
        mantissa = -round(math.log2(f.eps))
        return f.bits - 1 - mantissa, mantissa

    both, e16, m16, eb16, mb16 = said(
        text,
        r"Both have (\d+) bits; they spend them differently\. fp16 has (\d+) exponent bits and "
        r"(\d+) of mantissa; bf16 has fp32's (\d+) exponent bits and only (\d+) of mantissa",
    )
    assert int(both) == 16
    assert (int(e16), int(m16)) == exponent_mantissa(fp16)
    assert (int(eb16), int(mb16)) == exponent_mantissa(bf16)
    assert exponent_mantissa(fp32)[0] == int(eb16)
    (top,) = said(text, r"\(fp16 tops out at ([\d,]+)\)")
    assert int(top.replace(",", "")) == fp16.max
    (below,) = said(text, r"Week 3 goes below (\d+) bits: \[FP8")
    assert int(below) == fp16.bits


def check_scaler(text: str) -> None:
    """halve / double: the defaults of our scaler and of torch's, and the page's own run."""
    down, up = said(
        text,
        r"A \*\*dynamic\*\* scaler turns that into a signal: skip this step, (halve) S; after "
        r"`growth_interval` clean steps, (double) S\.",
    )
    factors = {"halve": 0.5, "double": 2.0}
    for scaler in (DynamicLossScaler, torch.amp.GradScaler):
        defaults = inspect.signature(scaler.__init__).parameters
        assert defaults["backoff_factor"].default == factors[down]
        assert defaults["growth_factor"].default == factors[up]
    clean, up2, down2 = said(
        text,
        r"(Two) clean steps (double) the scale; the overflow skips the step, (halves) the scale "
        r"and restarts the count",
    )
    (interval,) = said(text, r"DynamicLossScaler\(init_scale=2\.0\*\*16, growth_interval=(\d)\)")
    scales = [int(x.replace(",", "")) for x in re.findall(r"next scale=([\d,]+)", text)]
    assert clean == "Two" and int(interval) == 2
    assert scales[1] == 2 * scales[0] == 2 * 2**16 and up2 == "double"
    assert scales[2] == scales[1] // 2 and down2 == "halves"
    (skip,) = said(text, r"so the model is exactly as it was; the scale (halves), and the next")
    assert skip == "halves" and factors["halve"] == 0.5
    steps, overflows = said(
        text, r"checks, after every one of (\d+) steps with (three) injected overflows"
    )
    source = (ROOT / "tests" / "tinyscale" / "core" / "test_precision.py").read_text()
    parity = source.split("def test_matches_torch_grad_scaler_step_by_step")[1].split("\ndef ")[0]
    assert re.search(r"for step in range\((\d+)\)", parity)[1] == steps
    injected = re.search(r"overflow_at = \{(.*?)\}", parity)[1]
    assert injected.count(":") == {"two": 2, "three": 3, "four": 4}[overflows]


def check_learning_rates(text: str) -> None:
    (lr,) = said(text, r"`scaled_lr\(base_lr=3e-3, base_batch=16, batch=64\)` is ([\d.e-]+)\.")
    assert float(lr) == scaled_lr(base_lr=3e-3, base_batch=16, batch=64)
    base_batch, base_lr, batch = said(
        text,
        r"used a batch of (\d+) at learning rate ([\d.e-]+)\. You want an effective batch of (\d+)\.",
    )
    times, k, lr2, result = said(
        text,
        r"the batch is (\d)× the recipe's, so the learning rate is (\d) × ([\d.e-]+) = ([\d.e-]+), reached",
    )
    assert int(times) == int(k) == int(batch) // int(base_batch) and lr2 == base_lr
    expected = scaled_lr(base_lr=float(base_lr), base_batch=int(base_batch), batch=int(batch))
    assert math.isclose(float(result), expected)


def check_fp16_underflow(text: str) -> None:
    """ "a gradient of 10⁻⁸ underflows to zero" and "below about 6 × 10⁻⁸ become 0": fp16's
    smallest step (its smallest subnormal) is 2⁻²⁴ ≈ 5.96e-8."""
    digit = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")
    (small,) = said(text, r"In fp16 a gradient of 10⁻([⁰¹²³⁴⁵⁶⁷⁸⁹]) \*\*underflows to zero\*\*")
    assert torch.tensor(10.0 ** -int(small.translate(digit))).half().item() == 0.0
    mantissa, power = said(text, r"gradients below about (\d) × 10⁻([⁰¹²³⁴⁵⁶⁷⁸⁹]) become 0")
    smallest = torch.finfo(torch.float16).smallest_normal * 2.0**-10  # the least subnormal
    assert round(smallest / 10.0 ** -int(power.translate(digit))) == int(mantissa)
    assert torch.tensor(smallest).half().item() > 0.0  # just below it is 0, not at it


CHECKS = [
    check_fp16_underflow,
    check_foreach,
    check_alpha_beta_caption,
    check_accumulation,
    check_accumulation_ratio,
    check_ring_latency,
    check_exercise_bytes,
    check_buckets,
    check_formats,
    check_scaler,
    check_learning_rates,
]


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_those_of_the_data(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_alpha_beta_caption, "tree wins by 30×", "tree wins by 60×"),
        (check_accumulation, "gradient, a quarter of", "gradient, a half of"),
        (check_accumulation_ratio, "activations, about 8×.", "activations, about 4×."),
        (check_ring_latency, "that is 2,046 steps", "that is 1,023 steps"),
        (check_fp16_underflow, "about 6 × 10⁻⁸", "about 3 × 10⁻⁸"),
        (check_exercise_bytes, "in 6 steps instead of 14", "in 7 steps instead of 14"),
        (check_exercise_bytes, "≈ 1.97 S", "≈ 1.98 S"),
        (check_buckets, "(25 MiB by default)", "(50 MiB by default)"),
        (check_formats, "tops out at 65,504)", "tops out at 65,536)"),
        (check_scaler, "one of 14 steps", "one of 12 steps"),
        (check_learning_rates, "is 1.2e-2.", "is 1.2e-3."),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
