"""The numbers in the prose of docs/week-1/collectives.md, against the code, the tests and
the recorded benchmark (docs/generated/week1/collectives_busbw.json, collectives_sweep.json):

- the ring's N − 1 steps per phase, against the loops of the code;
- the shape check's row (13 int64s, 104 bytes), against `META`;
- the tolerance for random floats, against the tests that use it;
- the bytes each rank sent in the compared output, and the arithmetic the page does on them;
- the benchmark's sizes and rounds, and the small- and large-message sentences, against
  the recording;
- recursive doubling beating gloo at the smallest sizes, and what all_reduce picks (the
  recording's column, the crossover at N = 4 from THIS_MACHINE);
- the 4 KiB pages of the page-fault sentences, against this machine's page size;
- the pipelined demo's chunks and segments, and the sweep's sizes and segments.

Timings differ from run to run: when `make figures` records new ones, these tests fail
until the sentences say what the new recording says.
"""

from __future__ import annotations

import inspect
import json
import mmap
import platform
import re

import pytest
import torch

from helpers import ROOT, fails_when_changed, load_script, prose, recorded_output, said
from tinyscale.comm import choose_allreduce, collectives, pipelined_ring

PAGE = "week-1/collectives.md"
GENERATED = ROOT / "docs" / "generated" / "week1"
KiB, MiB = 2**10, 2**20
SUPERSCRIPT = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")
IMPLS = ("ring", "pipelined", "doubling", "all_reduce", "gloo")


def busbw_rows() -> dict[int, dict]:
    return {
        row["bytes"]: row for row in json.loads((GENERATED / "collectives_busbw.json").read_text())
    }


def check_ring_steps(text: str) -> None:
    said(text, r"\*\*Reduce-scatter, N − 1 steps\.\*\* At every step each rank sends one chunk")
    said(text, r"\*\*All-gather, N − 1 steps\.\*\* The finished chunks go round once more")
    said(text, r"reduce-scatter pays, in each of its N − 1 steps, one message and one whole-chunk")
    said(text, r"Cut into P segments, the N − 1 steps become one stream of \(N − 1\) · P messages")
    for fn in (
        collectives._ring_reduce_scatter,
        collectives._ring_all_gather,
        pipelined_ring._pipelined_reduce_scatter,
    ):
        assert "for step in range(world - 1):" in inspect.getsource(fn), fn.__name__
    # the pipelined reduce-scatter sends a chunk's P segments per step
    assert "sends += segments[" in inspect.getsource(pipelined_ring._pipelined_reduce_scatter)


def check_shape_row(text: str) -> None:
    numbers, nbytes = said(
        text,
        r"in (\d+) numbers and those rows go round the ring first \(an all-gather of (\d+) "
        r"bytes per step\)",
    )
    assert int(numbers) == collectives.META
    assert int(nbytes) == collectives.META * torch.tensor([], dtype=torch.int64).element_size()


def check_tolerance(text: str) -> None:
    (agree,) = said(text, r"floats they agree only within the tests' tolerance of 10⁻([⁰-⁹]+):")
    (allow,) = said(text, r"so the last bits may differ \(the tests allow 10⁻([⁰-⁹]+)\)")
    (doubling,) = said(
        text,
        r"they agree within the tests' tolerance of 10⁻([⁰-⁹]+) for recursive doubling "
        r"\(`RTOL` and `ATOL` in `test_recursive_doubling.py`\)",
    )
    for name, exponents in (
        ("test_collectives", (agree, allow)),
        ("test_pipelined_ring", (agree, allow)),
        ("test_recursive_doubling", (doubling,)),
    ):
        tests = load_script(name, folder="tests/tinyscale/comm")
        for said_exponent in exponents:
            bound = 10.0 ** -int(said_exponent.translate(SUPERSCRIPT))
            assert tests.RTOL == tests.ATOL == bound, name


def compared_rows() -> dict[tuple[int, str], dict[str, float]]:
    """(rank, shape) -> S, sent and the formula, from the page's compared output."""
    rows = {}
    for line in recorded_output(PAGE, "run_on_ranks(compare_with_torch, 3)"):
        m = re.fullmatch(
            r"rank (\d) \| shape (\[.*?\]) \| equal: True \| S = (\d+) B \| sent (\d+) B \| "
            r"2\(N-1\)/N\*S = ([\d.]+) B",
            line,
        )
        assert m, line
        rows[int(m[1]), m[2]] = {"S": int(m[3]), "sent": int(m[4]), "formula": float(m[5])}
    return rows


def check_bytes_sent(text: str) -> None:
    world = 3
    rows = compared_rows()
    elements, every = said(text, r"\((\d+) elements: (\d+) B on every rank\)")
    assert int(elements) == 3 * 4
    assert {rows[r, "[3, 4]"]["sent"] for r in range(world)} == {int(every)}
    assert rows[0, "[3, 4]"]["formula"] == int(every)
    *chunk_bytes, rank0, rank1, total = said(
        text,
        r"Seven elements in chunks of 3, 2, 2 \((\d+), (\d+), (\d+) bytes\) give 56 − 12 − 8 = "
        r"(\d+) B for rank 0 and 56 − 8 − 8 = (\d+) B for rank 1\. The total over ranks is "
        r"always exactly 2 \(N − 1\) · S \(here (\d+) B\)",
    )
    chunks = [len(c) * 4 for c in torch.arange(7.0).tensor_split(world)]
    assert [int(b) for b in chunk_bytes] == chunks
    size = rows[0, "[7]"]["S"]
    assert 2 * size - chunks[0] - chunks[1] == int(rank0) == rows[0, "[7]"]["sent"]
    assert 2 * size - chunks[1] - chunks[2] == int(rank1) == rows[1, "[7]"]["sent"]
    assert sum(rows[r, "[7]"]["sent"] for r in range(world)) == int(total) == 2 * (world - 1) * size


def check_benchmark_sizes(text: str) -> None:
    rows = busbw_rows()
    first = said(text, r"interleaved round by round, from (\d+) KiB to (\d+) MiB, and reports")
    second = said(text, r"The full run, (\d+) KiB to (\d+) MiB in (\d+) rounds, between the link")
    (median,) = said(text, r"the benchmark reports the median of (\d+) interleaved rounds")
    for smallest, largest in (first, second[:2]):
        assert (int(smallest) * KiB, int(largest) * MiB) == (min(rows), max(rows))
    assert {row["rounds"] for row in rows.values()} == {int(second[2]), int(median)}


def check_small_messages(text: str) -> None:
    kib, word, mib, times = said(
        text,
        r"A (\d+) KiB all-reduce on two ranks is two ring steps, and in the recorded run "
        r"gloo's reaches less than (a tenth) of the bus bandwidth of a (\d+) MiB one, which has "
        r"(\d+) times the bytes",
    )
    rows = busbw_rows()
    small, big = rows[int(kib) * KiB], rows[int(mib) * MiB]
    assert small["world_size"] == 2, "two ring steps: 2 (N − 1)"
    assert big["bytes"] // small["bytes"] == int(times)
    assert small["gloo_busbw"] < {"a tenth": 0.1}[word] * big["gloo_busbw"]


def check_large_messages(text: str) -> None:
    said(text, r"A GB/s or two of busbw is what those copies allow on this machine")
    rows = busbw_rows()
    best = max(row[f"{who}_busbw"] for row in rows.values() for who in IMPLS)
    assert 0.5e9 < best < 3e9
    said(text, r"reuses two segment-sized buffers .{0,200}which is why it pulls ahead there")
    assert rows[64 * MiB]["ring_ratio"] < 0.9, "gloo pulls ahead of the plain ring at 64 MiB"


def check_doubling_beats_gloo_when_small(text: str) -> None:
    """Two sentences: recursive doubling, in Python, beats gloo where messages are small."""
    said(text, r"the last one also beats it where messages are small")
    said(text, r"and ours in Python beats gloo's C\+\+ at the smallest sizes")
    rows = busbw_rows()
    for size in sorted(rows)[:2]:  # 4 KiB and 16 KiB
        assert rows[size]["doubling_ratio"] > 1, size


def check_fit_drift(text: str) -> None:
    (factor,) = said(text, r"by a factor of ([\d.]+) either way before the test")
    tests = load_script("test_recursive_doubling", folder="tests/tinyscale/comm")
    assert float(factor) == tests.FIT_DRIFT


def check_choices(text: str) -> None:
    """On two ranks all_reduce always picks recursive doubling; on four the ring above 8 α B."""
    said(text, r"On the benchmark's two ranks, then, `all_reduce` always picks recursive doubling")
    said(text, r"on four it switches to the ring at 8 α B")
    said(text, r"\*\*N = 4: S\\\* = 4 α B / \(2 − 3/2\) = 8 α B\.\*\*")
    assert {row["picks"] for row in busbw_rows().values()} == {"recursive doubling"}
    link = choose_allreduce.THIS_MACHINE
    crossover = 8 * link.alpha_s * link.bandwidth_bps
    assert choose_allreduce.choose(int(crossover * 0.99), 4) == "recursive doubling"
    assert choose_allreduce.choose(int(crossover * 1.01), 4) == "pipelined ring"
    assert choose_allreduce.choose(2**40, 2) == "recursive doubling"


def check_page_size(text: str) -> None:
    said(text, r"the first touch of each 4 KiB page of new memory is a page fault")
    said(text, r"the first write to each of its 4 KiB pages is a page fault")
    if platform.system() == "Linux" and platform.machine() == "x86_64":  # the recording's kind
        assert mmap.PAGESIZE == 4 * KiB


def check_pipelined_demo(text: str) -> None:
    *sizes, most, segment, parts = said(
        text,
        r"1000 float32 on 3 ranks make chunks of (\d+), (\d+) and (\d+) elements \((\d+) bytes "
        r"at most\); (\d+)-byte segments cut each into P = (\d+)\.",
    )
    chunks = [len(c) for c in torch.arange(1000.0).tensor_split(3)]
    assert [int(s) for s in sizes] == chunks and int(most) == max(chunks) * 4
    default = inspect.signature(pipelined_ring.compare_with_ring).parameters["segment_bytes"]
    assert int(segment) == default.default
    assert int(parts) == pipelined_ring.segments_per_chunk(1000, 3, 4, int(segment))
    lines = recorded_output(PAGE, "run_on_ranks(compare_with_ring, 3)")
    assert all(f"| P = {parts}:" in line for line in lines)


def check_sweep(text: str) -> None:
    low, high, *sizes = said(
        text,
        r"times the pipelined ring at segments from (\d+) KiB to (\d+) MiB against gloo, "
        r"interleaved, at (\d+), (\d+) and (\d+) MiB",
    )
    rows = json.loads((GENERATED / "collectives_sweep.json").read_text())
    segments = {row["segment_bytes"] for row in rows}
    assert (int(low) * KiB, int(high) * MiB) == (min(segments), max(segments))
    assert sorted({row["bytes"] for row in rows}) == [int(s) * MiB for s in sizes]


CHECKS = [
    check_ring_steps,
    check_shape_row,
    check_tolerance,
    check_bytes_sent,
    check_benchmark_sizes,
    check_small_messages,
    check_large_messages,
    check_doubling_beats_gloo_when_small,
    check_choices,
    check_fit_drift,
    check_page_size,
    check_pipelined_demo,
    check_sweep,
]


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_those_of_the_data(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_shape_row, "an all-gather of 104 bytes", "an all-gather of 52 bytes"),
        (check_tolerance, "the tests allow 10⁻⁵", "the tests allow 10⁻⁶"),
        (check_bytes_sent, "(here 112 B)", "(here 108 B)"),
        (check_benchmark_sizes, "to 64 MiB in 15 rounds", "to 64 MiB in 7 rounds"),
        (check_small_messages, "of a 1 MiB one, which has 256", "of a 4 MiB one, which has 256"),
        (check_large_messages, "A GB/s or two of busbw", "A GB/s or three of busbw"),
        (check_choices, "switches to the ring at 8 α B", "switches to the ring at 6 α B"),
        (check_fit_drift, "by a factor of 2 either way", "by a factor of 3 either way"),
        (check_pipelined_demo, "(1336 bytes at most)", "(1332 bytes at most)"),
        (check_sweep, "from 64 KiB to 32 MiB", "from 64 KiB to 16 MiB"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
