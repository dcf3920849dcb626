"""The numbers in the sentences of "GPU memory and fragmentation" (operations/gpu-memory.md).

Each is compared with what it repeats: the workload's sizes and the cap with the header of
the command's output, which CI compares with a run; the free and cached memory at the OOM,
and what fragmentation costs, with the allocator model replayed here; the bytes per
parameter with tinyscale.core.memory; the page size and the split limit with the model's
constants and settings.
"""

from __future__ import annotations

import re

from helpers import fails_when_changed, prose, recorded_output, said
from tinyscale.core.memory import MiB, model_state_bytes
from tinyscale.ops.allocator import LARGE_BUFFER, AllocatorConfig
from tinyscale.ops.fragmentation import SETTINGS, memory_map, replay, training_steps

PAGE = "operations/gpu-memory.md"


def workload() -> dict[str, int]:
    """The sizes the command's recorded (and compared) output states in its first line."""
    header = recorded_output(PAGE, "python -m tinyscale.ops.fragmentation\n")[0]
    m = re.match(
        r"steps: long \((\d+) x (\d+) MiB\), short \(\d+ x (\d+) MiB\), long again; (\d+) MiB "
        r"kept per step; modelled GPU (\d+) MiB",
        header,
    )
    assert m, header
    layers, long, short, keep, capacity = map(int, m.groups())
    return {"layers": layers, "long": long, "short": short, "keep": keep, "capacity": capacity}


def default_replay(w: dict[str, int], capacity_mib: int | None = None, **kwargs: object):
    long_step, short_step = ([mib * MiB] * w["layers"] for mib in (w["long"], w["short"]))
    ops = training_steps([long_step, short_step, long_step], keep_bytes=w["keep"] * MiB)
    capacity = (capacity_mib or w["capacity"]) * MiB
    return replay(ops, AllocatorConfig(capacity=capacity, **kwargs))


def check_sizes(text: str) -> None:
    w = workload()
    (per_param,) = said(text, r"\| (\d+) bytes per parameter with Adam \(\[Session A\]")
    assert {model_state_bytes(1, p).total for p in ("fp32", "bf16")} == {int(per_param)}
    (page,) = said(text, r"mapped\* into it in pages \((\d+) MiB in the large pool\)")
    assert int(page) * MiB == LARGE_BUFFER
    (cap,) = said(text, r"PyTorch's real allocator, capped at (\d+) GiB with")
    assert int(cap) * 1024 == w["capacity"]
    (kept,) = said(text, r"Its kept tensor \((\d+) MiB\) got a fifth")
    (short,) = said(text, r"Step 1's activations are (\d+) MiB\. Best fit")
    (left,) = said(text, r"50 \+ 50 \+ 50 \+ 50, (\d+) MiB left over\)")
    (last,) = said(text, r"kept tensor fit exactly into those last (\d+) MiB")
    (pin,) = said(text, r"free MiB, and its (\d+) MiB tensor pins it")
    (one,) = said(text, r"How can one (\d+) MiB tensor cause an out-of-memory error")
    assert (int(kept), int(short)) == (w["keep"], w["short"])
    assert int(left) == w["long"] - w["layers"] * w["short"]
    assert {int(last), int(pin), int(one)} == {w["keep"]}
    assert memory_map(default_replay(w).allocator)[0] == (
        f"segment 0 ({w['long']} MiB): free {w['long'] - int(left)} | used {int(left)}"
    )
    split, own = said(
        text,
        r"`max_split_size_mb:64`\*\*: blocks of (\d+) MiB or more are never split, and smaller "
        r"requests may not use them\. The (\d+) MiB activations get their own segments",
    )
    assert SETTINGS["max_split_size_mb:64"]["max_split_size"] == int(split) * MiB
    assert int(own) == w["short"]
    long_step, short_step = ([mib * MiB] * w["layers"] for mib in (w["long"], w["short"]))
    ops = training_steps([long_step, short_step], keep_bytes=w["keep"] * MiB)
    config = AllocatorConfig(capacity=w["capacity"] * MiB, **SETTINGS["max_split_size_mb:64"])
    step1 = replay(ops[: 3 * w["layers"] + 1], config).allocator  # step 1's activations live
    assert sum(f"({own} MiB): used {own}" in line for line in memory_map(step1)) == w["layers"]


def check_oom(text: str) -> None:
    free, cached, total = said(
        text,
        r"At that moment (\d+) MiB are free on the device and (\d+) MiB are reserved but "
        r"unused: (\d+) MiB in all",
    )
    w = workload()
    s = default_replay(w).allocator.stats()
    assert int(free) * MiB == w["capacity"] * MiB - s.reserved
    assert int(cached) * MiB == s.reserved_unallocated
    assert int(total) == int(free) + int(cached)


def check_cost(text: str) -> None:
    (cost,) = said(text, r"Fragmentation costs the default allocator (\d+) MiB here")
    w = workload()
    needs = next(m for m in range(850, 1300, 2) if default_replay(w, m).oom is None)
    peak = default_replay(w, needs).peak_allocated // MiB
    assert int(cost) == needs - peak


def test_sizes_are_the_workload_and_the_model() -> None:
    check_sizes(prose(PAGE))


def test_free_and_cached_at_the_oom_are_the_model() -> None:
    check_oom(prose(PAGE))


def test_what_fragmentation_costs_is_measured() -> None:
    check_cost(prose(PAGE))


def test_the_checks_fail_when_a_number_changes() -> None:
    text = prose(PAGE)
    fails_when_changed(check_oom, text, "unused: 374 MiB", "unused: 364 MiB")
    fails_when_changed(check_cost, text, "allocator 190 MiB", "allocator 180 MiB")
    fails_when_changed(check_sizes, text, "Its kept tensor (10 MiB)", "Its kept tensor (20 MiB)")
