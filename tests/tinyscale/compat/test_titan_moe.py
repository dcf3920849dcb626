"""torchtitan's MoE on CPU (tinyscale.compat.titan_config.tinyscale_moe).

The run is the MoE page's code block: CI runs it (4 gloo ranks, EP 2 x FSDP 2) and
compares its output with the recorded text. These tests check that text against the
config it came from: the mesh, the parameter counts by the page's formula (total, and
active per token), and a loss that falls.
"""

import re

import pytest

from helpers import recorded_output

pytest.importorskip("torchtitan", reason="torchtitan is in the cluster extra: make setup")

PAGE = "week-3/moe.md"


def recorded() -> list[str]:
    return recorded_output(PAGE, "--config tinyscale_moe 2>&1")


def test_config_is_three_blocks_of_the_debug_model_with_ep_2() -> None:
    from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel

    from tinyscale.compat.titan_config import tinyscale_debug, tinyscale_moe

    config, full, laptop = tinyscale_moe(), deepseek_v3_debugmodel(), tinyscale_debug()
    layers = config.model_spec.model.layers
    assert len(layers) == 3 < len(full.model_spec.model.layers)  # the first 3 of 6
    assert [block.moe is not None for block in layers] == [False, True, True]
    p = config.parallelism
    assert (p.data_parallel_shard_degree, p.expert_parallel_degree) == (-1, 2)
    assert p.spmd_backend == "partial_dtensor" and config.training.disable_cuda_graphs
    assert config.hf_assets_path == laptop.hf_assets_path
    assert config.dataloader.dataset_path == laptop.dataloader.dataset_path
    assert config.training.seq_len == laptop.training.seq_len


def test_recorded_mesh_splits_the_experts_over_ep_then_efsdp() -> None:
    lines = recorded()
    assert lines[0] == (
        "Building device mesh with parallelism: pp=1, dp_replicate=1, dp_shard=4, cp=1, tp=1, ep=2"
    )
    meshes = re.search(r"active dimensions: \[(.*)\]", lines[1])
    assert meshes and {"ep", "efsdp", "fsdp"} <= set(meshes[1].replace("'", "").split(", "))


def test_recorded_parameter_counts_follow_the_pages_formula() -> None:
    """sparse = the MoE blocks (routed experts, shared expert, router); active = total
    minus the (1 - k/E) share of the routed experts a token skips."""
    from tinyscale.compat.titan_config import tinyscale_moe

    moe_blocks = [b.moe for b in tinyscale_moe().model_spec.model.layers if b.moe is not None]
    routed = sparse = 0
    for moe in moe_blocks:
        experts = moe.routed_experts.inner_experts
        shared = moe.shared_experts
        block_routed = experts.num_experts * 3 * experts.dim * experts.hidden_dim
        block_shared = 3 * shared.w1.in_features * shared.w1.out_features
        router = moe.router.gate.in_features * moe.router.gate.out_features
        routed += block_routed
        sparse += block_routed + block_shared + router
    k, num_experts = moe_blocks[0].router.top_k, moe_blocks[0].num_experts
    counts = re.search(
        r"dense ([\d,]+), sparse ([\d,]+), vision 0, active ([\d,]+)", "\n".join(recorded())
    )
    assert counts, "the recorded run prints torchtitan's parameter counts"
    dense, recorded_sparse, active = (int(x.replace(",", "")) for x in counts.groups())
    assert recorded_sparse == sparse
    assert active == dense + sparse - routed * (num_experts - k) // num_experts


def test_recorded_loss_falls() -> None:
    steps = [re.match(r"step: +(\d+) +loss: +([\d.]+)", x) for x in recorded()]
    losses = {int(m[1]): float(m[2]) for m in steps if m}
    assert sorted(losses) == [1, 2, 3]
    assert losses[3] < losses[1] - 0.3
    assert recorded()[-1] == "Training completed"
