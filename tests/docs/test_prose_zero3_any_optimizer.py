"""ZeRO-3 that takes any optimizer: the numbers in its prose are those of its demo and code.

tests/tinyscale/data_parallel/test_fully_sharded.py checks the demo's output against the
tolerances and the bytes formula; this file checks the rest of the prose against the
recorded output (a CI-compared block) and the code:

- a freed unit buffer keeps no bytes (``_free`` resizes the storage to 0);
- the steps the weights are compared after;
- half of every state per rank at N = 2, and AdamW's two moments against SGD's one;
- Exercise 3's padding: the root unit's 8,896 parameters over 3 ranks.
"""

from __future__ import annotations

import inspect
import re

import pytest
import torch

from helpers import fails_when_changed, prose, recorded_output, said
from tinyscale.core.memory import storage_bytes
from tinyscale.data_parallel.fully_sharded import FullyShardedModel

PAGE = "week-4/zero3-any-optimizer.md"
SHARE = {"half": 2, "twice": 2, "a third": 3}


def demo() -> list[str]:
    return recorded_output(PAGE, "demo(world_size=2)")


def bytes_table() -> dict[str, list[int]]:
    """Row -> one process, rank 0, rank 1, from the demo's 'bytes per rank' table."""
    rows = {}
    for line in demo():
        found = re.fullmatch(r"(\D+?)\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)", line)
        if found:
            rows[found[1]] = [int(x.replace(",", "")) for x in found.groups()[1:]]
    return rows


def check_free(text: str) -> None:
    (left,) = said(text, r"its storage shrinks to (\d) bytes; the views keep their shapes")
    assert "untyped_storage().resize_(0)" in inspect.getsource(FullyShardedModel._free)
    flat = torch.zeros(12)
    view = flat[:6].view(2, 3)
    flat.untyped_storage().resize_(0)  # what _free does; the tensors' data is gone
    freed, shape = storage_bytes([flat, view]), tuple(view.shape)
    del flat, view  # never printed: reading a freed tensor's data is undefined
    assert freed == int(left) and shape == (2, 3)
    assert "full buffers left after the last step: [0, 0]" in demo()


def check_steps(text: str) -> None:
    (steps,) = said(text, r"After (\d) steps SGD ends 3\.7e-09 from one process")
    assert f"largest weight difference after {steps} steps" in "\n".join(demo())
    assert f", {steps} steps on 8 sequences" in demo()[0]


def check_state_per_rank(text: str) -> None:
    (share,) = said(text, r"\*\*Each rank holds (half) of every state\.\*\* 51,968 bytes")
    table = bytes_table()
    for row in ("weights", "gradients", "SGD momentum", "AdamW m and v"):
        whole, *ranks = table[row]
        assert ranks == [whole // SHARE[share]] * 2 and whole % SHARE[share] == 0
    (times,) = said(text, r"AdamW's two moments take (twice) SGD's one momentum buffer")
    assert table["AdamW m and v"] == [SHARE[times] * n for n in table["SGD momentum"]]


def check_padding(text: str) -> None:
    root, ranks, share, extra, zeros = said(
        text,
        r"Only the root needs padding: ([\d,]+) = (\d) × ([\d,]+) \+ (\d), so it gets (\d) zeros",
    )
    recorded = recorded_output(PAGE, "units.append(model.num_parameters() - sum(units))")
    units = [int(x) for x in re.findall(r"\d+", recorded[0].split("]")[0])]
    assert units[-1] == int(root.replace(",", "")) and int(ranks) == 3
    assert divmod(units[-1], int(ranks)) == (int(share.replace(",", "")), int(extra))
    assert all(n % int(ranks) == 0 for n in units[:-1]), "only the root"
    assert int(zeros) == int(ranks) - int(extra)
    assert recorded[0].endswith(f"padding {zeros}")


@pytest.mark.parametrize("check", [check_free, check_steps, check_state_per_rank, check_padding])
def test_the_pages_numbers_are_those_of_the_data(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_free, "shrinks to 0 bytes", "shrinks to 8 bytes"),
        (check_steps, "After 3 steps SGD", "After 2 steps SGD"),
        (check_state_per_rank, "take twice SGD's", "take a third SGD's"),
        (check_padding, "3 × 2,965 + 1", "3 × 2,966 + 1"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
