"""tinyscale.data_parallel.sharded_optimizer: ZeRO-1 around any torch.optim class, against
torch's ZeroRedundancyOptimizer and one process (the 2D page shows the same at N = 2)."""

import pytest

from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.config import preset
from tinyscale.core.errors import UsageError
from tinyscale.data_parallel.sharded_optimizer import against_torch, partition

ADAMW_TOLERANCE = 1e-4  # averaged gradients add in another order; Adam amplifies (1.3e-5)
SGD_TOLERANCE = 1e-7  # (measured 3.7e-9)


def both(world: int) -> dict:
    return {name: against_torch(name) for name in ("AdamW", "SGD")}


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_on_ranks(both, 4, 4)


@pytest.mark.parametrize(
    ("name", "tolerance"), [("AdamW", ADAMW_TOLERANCE), ("SGD", SGD_TOLERANCE)]
)
def test_equal_to_torchs_zero_and_to_one_process(ranks, name, tolerance) -> None:
    for rank in ranks:
        assert rank[name]["ours vs torch"] == 0.0  # the same partition, the same arithmetic
        assert rank[name]["ours vs one process"] < tolerance


def test_each_rank_holds_about_a_quarter_of_the_state(ranks) -> None:
    params = ranks[0]["SGD"]["params"]
    momentum = [rank["SGD"]["state"] for rank in ranks]  # one buffer per parameter
    assert sum(momentum) == params
    largest = preset("tiny").vocab_size * preset("tiny").hidden_size  # the embedding, 8,320
    assert max(momentum) - min(momentum) <= largest  # greedy: never more than one parameter
    assert max(momentum) == largest  # here the embedding alone is one rank's share
    assert [rank["AdamW"]["state"] for rank in ranks] == [2 * m for m in momentum]


def test_partition_is_greedy_by_size() -> None:
    assert partition([10, 1, 1, 8], 2) == [0, 1, 1, 1]
    with pytest.raises(UsageError, match="3 parameters cannot give each of 4 ranks one to own"):
        partition([1, 2, 3], 4)
