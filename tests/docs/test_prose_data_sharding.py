"""The counts in the prose of docs/week-1/data-sharding.md, against the sharding code and
the page's compared outputs:

- which samples are read twice, in the first example, in the padding formula, in the
  evaluation example and in the exercises, recomputed with `shard_batches`;
- the 3 s timeout of the uneven-steps run, against the call on the page.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from helpers import fails_when_changed, prose, said
from tinyscale.data_parallel.data_sharding import shard_batches

PAGE = "week-1/data-sharding.md"


def reads(n: int, batch_size: int, world: int, **kw) -> Counter[int]:
    """How many times each sample is read, over all ranks, in one epoch."""
    return Counter(
        i
        for rank in range(world)
        for batch in shard_batches(
            range(n), batch_size=batch_size, world_size=world, rank=rank, **kw
        )
        for i in batch
    )


def twice(counts: Counter[int]) -> list[int]:
    return sorted(i for i, c in counts.items() if c == 2)


def check_first_example(text: str) -> None:
    steps, split_steps, first, second = said(
        text,
        r"\(([\d]+), or ([\d]+) when split\), and some samples are read twice: "
        r"(\d+–\d+) in the first mode, (\d+–\d+) in the second\.",
    )
    for split, n_steps, span in ((False, steps, first), (True, split_steps, second)):
        counts = reads(10, 4, 2, split_batches=split)
        assert max(counts.values()) == 2
        lo, hi = (int(x) for x in span.split("–"))
        assert twice(counts) == list(range(lo, hi + 1))
        shards = [
            shard_batches(range(10), batch_size=4, world_size=2, rank=r, split_batches=split)
            for r in range(2)
        ]
        assert [len(s) for s in shards] == [int(n_steps)] * 2


def check_padding_formula(text: str) -> None:
    said(
        text,
        r"With `even_batches=True`, `\(-n\) mod step` samples are read twice per epoch — less "
        r"than one step's worth \(a data set shorter than its padding is cycled through more "
        r"than twice\)\.",
    )
    for world in (1, 2, 3, 4):
        for batch_size in (1, 2, 3, 4):
            step = batch_size * world
            for n in range(1, 3 * step + 2):
                counts = reads(n, batch_size, world)
                padding = -n % step
                assert padding < step and sum(counts.values()) == n + padding
                if padding <= n:
                    assert max(counts.values()) <= 2 and len(twice(counts)) == padding
                else:
                    assert max(counts.values()) > 2


def check_evaluation(text: str) -> None:
    (span,) = said(text, r"Summing the per-rank results counts (\d\.\.\d) twice;")
    rows = said(
        text,
        r"rank 0: read (\d+) samples \| all-reduced sum (\d+) \| gathered and trimmed (\d+)",
    )
    seen, naive, trimmed = (int(x) for x in rows)
    lo, hi = (int(x) for x in span.split(".."))
    counts = reads(10, 4, 2)
    assert twice(counts) == list(range(lo, hi + 1))
    assert naive - trimmed == sum(i * i for i in range(lo, hi + 1))
    assert 2 * seen == sum(counts.values())


def check_count_the_padding(text: str) -> None:
    said(text, r"How many batches does each rank get, and how many samples are read twice\?")
    step, steps, slots, dup, span, batches = said(
        text,
        r"One step takes 4 × 4 = (\d+) samples; 23 needs (\d+) steps = (\d+) slots, so (\d+) "
        r"samples \((\d+–\d+)\) are read twice, and every rank gets (\d+) batches\.",
    )
    assert int(step) == 4 * 4 and int(slots) == int(steps) * int(step) >= 23
    counts = reads(23, 4, 4)
    lo, hi = (int(x) for x in span.split("–"))
    assert twice(counts) == list(range(lo, hi + 1)) and len(twice(counts)) == int(dup)
    assert max(counts.values()) == 2 and sum(counts.values()) == int(slots)
    shards = [shard_batches(range(23), batch_size=4, world_size=4, rank=r) for r in range(4)]
    assert [len(s) for s in shards] == [int(batches)] * 4


def check_different_seeds(text: str) -> None:
    said(
        text,
        r"With different seeds each rank takes its share of a different permutation: "
        r"some samples are read twice, others never\.",
    )

    def mine(rank: int, seed: int) -> list[int]:
        order = torch.randperm(16, generator=torch.Generator().manual_seed(seed)).tolist()
        shard = shard_batches(order, batch_size=4, world_size=2, rank=rank)
        return [i for batch in shard for i in batch]

    counts = Counter(mine(0, 0) + mine(1, 1))
    assert twice(counts) and set(range(16)) - set(counts), "some twice, others never"
    assert max(counts.values()) == 2


def check_timeout(text: str) -> None:
    (code_s,) = said(text, r"run_on_ranks\(uneven_steps, 2, 10, 4, timeout_s=(\d+)\)")
    (page_s,) = said(text, r"the (\d+) s timeout would end the wait\)")
    assert code_s == page_s


CHECKS = [
    check_first_example,
    check_padding_formula,
    check_evaluation,
    check_count_the_padding,
    check_different_seeds,
    check_timeout,
]


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_counts_are_those_of_the_code(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_first_example, "0–5 in the first mode", "0–3 in the first mode"),
        (check_evaluation, "counts 0..5 twice", "counts 0..4 twice"),
        (check_count_the_padding, "so 9 samples (0–8)", "so 7 samples (0–6)"),
        (check_timeout, "the 3 s timeout", "the 5 s timeout"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
