"""tinyscale.expert_parallel.ep_moe on gloo: EP = 4, dropless and with a capacity
that drops, against one process, and the bytes its all-to-alls are handed against the formula.

One run_on_ranks launch. Each rank runs ``parity`` twice (docs/week-3/moe.md shows it with
EP = 2, dropless):

- the rank's outputs and input gradients equal the one-process layer's on its tokens;
- the gradients of the experts it holds equal the one-process gradients of those experts
  (tokens from every rank reached them: no all-reduce needed);
- the router's gradient, all-reduced, equals the one-process gradient;
- summed over the ranks, the bytes handed to all_to_all_single are ep times the formula
  4*k*T*H*4 (+ 8 bytes per expert for the counts), to the byte.
"""

import pytest

from helpers import one_line_error
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.errors import UsageError
from tinyscale.expert_parallel.ep_moe import ExpertParallelMoE, parity
from tinyscale.expert_parallel.moe import MoE
from tinyscale.expert_parallel.moe_routing import MoEConfig

ROUTER_TOLERANCE = 1e-6  # an all-reduce of 4 partial sums adds in another order (1.5e-8)


def facts(seed: int) -> dict:
    return {
        "dropless": parity(seed, None),
        "capacity": parity(seed, 1.0),
        "bad split": one_line_error(
            lambda: ExpertParallelMoE(MoE(16, 32, MoEConfig(num_experts=6)))
        ),
    }


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    """EP = 4 (the page shows EP = 2): one launch, both routings."""
    return run_on_ranks(facts, 4, 3, deadline_s=120)


@pytest.mark.parametrize("routing", ["dropless", "capacity"])
def test_outputs_and_gradients_equal_one_process(ranks, routing) -> None:
    for rank in ranks:
        found = rank[routing]
        assert found["output"] == found["input grad"] == found["experts"] == 0.0
        assert found["router"] < ROUTER_TOLERANCE
    loads = [rank[routing]["load"] for rank in ranks]
    assert len({tuple(load) for load in loads}) == 4  # every rank routed differently
    assert (sum(rank[routing]["dropped"] for rank in ranks) > 0) == (routing == "capacity")


@pytest.mark.parametrize("routing", ["dropless", "capacity"])
def test_bytes_handed_to_the_all_to_alls_are_the_formula(ranks, routing) -> None:
    found = [rank[routing] for rank in ranks]
    assert all(f["all_to_alls"] == 5 for f in found)  # counts, then 2 forward + 2 backward
    handed = sum(f["bytes"] for f in found)
    if routing == "dropless":  # every rank routes k*T rows
        assert handed == 4 * found[0]["formula"]
        assert len({f["bytes"] for f in found}) > 1  # per rank it varies with the routing
    else:  # the dropped rows travel nowhere: fewer than the formula's k*T
        assert handed < 4 * found[0]["formula"]


def test_experts_must_split_evenly_over_the_ranks(ranks) -> None:
    assert ranks[0]["bad split"] == (
        "6 experts do not split over 4 ranks: "
        "make num_experts a multiple of the expert-parallel size"
    )


def test_without_a_process_group_it_says_so() -> None:
    with pytest.raises(UsageError, match="ExpertParallelMoE needs a process group"):
        ExpertParallelMoE(MoE(16, 32, MoEConfig(num_experts=4)))
