"""tinyscale.model_parallel.expert_parallel on gloo: EP = 2 with capacity and EP = 4
dropless against one process, and the bytes its all-to-alls are handed against the formula.

One run_on_ranks launch per world size. Each rank runs ``parity`` (also shown on
docs/week-3/moe.md with EP = 2, dropless):

- the rank's outputs and input gradients equal the one-process layer's on its tokens;
- the gradients of the experts it holds equal the one-process gradients of those experts
  (tokens from every rank reached them: no all-reduce needed);
- the router's gradient, all-reduced, equals the one-process gradient;
- summed over the ranks, the bytes handed to all_to_all_single are ep times the formula
  4*k*T*H*4 (+ 8 bytes per expert for the counts), to the byte.
"""

import pytest
import torch

from helpers import one_line_error
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.errors import UsageError
from tinyscale.model_parallel.expert_parallel import ExpertParallelMoE, parity
from tinyscale.model_parallel.moe import MoE
from tinyscale.model_parallel.moe_routing import MoEConfig

ROUTER_TOLERANCE = 1e-6  # an all-reduce of 4 partial sums adds in another order (1.5e-8)


def with_bad_split(seed: int, factor: float | None) -> dict:
    facts = parity(seed, factor)
    facts["bad split"] = one_line_error(
        lambda: ExpertParallelMoE(MoE(16, 32, MoEConfig(num_experts=3)))
    ) if torch.distributed.get_world_size() == 2 else ""  # fmt: skip
    return facts


@pytest.fixture(scope="module", params=[(2, 1.0), (4, None)], ids=["ep2-capacity", "ep4-dropless"])
def ranks(request) -> tuple[int, float | None, list[dict]]:
    ep, factor = request.param
    return ep, factor, run_on_ranks(with_bad_split, ep, 3, factor, deadline_s=120)


def test_outputs_and_gradients_equal_one_process(ranks) -> None:
    ep, factor, facts = ranks
    for rank in facts:
        assert rank["output"] == rank["input grad"] == rank["experts"] == 0.0
        assert rank["router"] < ROUTER_TOLERANCE
    loads = [f["load"] for f in facts]
    assert len({tuple(load) for load in loads}) == ep  # every rank routed differently
    assert (sum(f["dropped"] for f in facts) > 0) == (factor is not None)


def test_bytes_handed_to_the_all_to_alls_are_the_formula(ranks) -> None:
    ep, factor, facts = ranks
    assert all(f["all_to_alls"] == 5 for f in facts)  # counts, then 2 forward + 2 backward
    if factor is None:  # dropless: every rank routes k*T rows
        assert sum(f["bytes"] for f in facts) == ep * facts[0]["formula"]
        assert len({f["bytes"] for f in facts}) > 1  # per rank it varies with the routing
    else:  # with drops, fewer rows than the formula's k*T
        assert sum(f["bytes"] for f in facts) < ep * facts[0]["formula"]


def test_experts_must_split_evenly_over_the_ranks(ranks) -> None:
    ep, _, facts = ranks
    if ep == 2:
        assert facts[0]["bad split"] == (
            "3 experts do not split over 2 ranks: "
            "make num_experts a multiple of the expert-parallel size"
        )


def test_without_a_process_group_it_says_so() -> None:
    with pytest.raises(UsageError, match="ExpertParallelMoE needs a process group"):
        ExpertParallelMoE(MoE(16, 32, MoEConfig(num_experts=4)))
