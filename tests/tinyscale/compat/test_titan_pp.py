"""torchtitan's pipeline on CPU (tinyscale.compat.titan_config.tinyscale_pp).

The run is the pipeline-torchtitan page's code block: CI runs it (2 gloo ranks, PP 2,
1F1B) and compares its output with the recorded text. These tests check that text
against torchtitan's own split and placement rules and against our torch_pipeline — the
stage split, the loss logged on the last stage's rank only, a loss that falls — and the
config function itself.
"""

import ast
import re

import pytest

from helpers import recorded_output

pytest.importorskip("torchtitan", reason="torchtitan is in the cluster extra: make setup")

# torchtitan's modules are imported in the tests that use them, not here: importing them
# costs seconds of CPU, and every pytest worker imports this file to collect it.
from tinyscale.pipeline_parallel.torch_pipeline import stage_placement

PAGE = "week-3/pipeline-torchtitan.md"
TORCH_NAMES = {"1F1B": "1f1b", "Interleaved1F1B": "interleaved", "ZBVZeroBubble": "zbv"}


def recorded() -> list[str]:
    return recorded_output(PAGE, "--config tinyscale_pp 2>&1")


def test_config_is_the_debug_one_cut_in_two_with_four_microbatches() -> None:
    from tinyscale.compat.titan_config import tinyscale_debug, tinyscale_pp

    config, base = tinyscale_pp(), tinyscale_debug()
    p = config.parallelism
    assert (p.pipeline_parallel_degree, p.pipeline_parallel_schedule) == (2, "1F1B")
    assert config.training.local_batch_size // p.pipeline_parallel_microbatch_size == 4
    assert config.training.disable_cuda_graphs and not config.checkpoint.enable
    # the same tokens per step as tinyscale_debug on 2 FSDP ranks
    tokens = config.training.local_batch_size * config.training.seq_len
    assert tokens == 2 * base.training.local_batch_size * base.training.seq_len
    assert config.hf_assets_path == base.hf_assets_path


@pytest.mark.parametrize("schedule", sorted(TORCH_NAMES))
@pytest.mark.parametrize("pp", [2, 4])
def test_our_placement_is_torchtitans(schedule: str, pp: int) -> None:
    from torchtitan.distributed.pipeline_parallel import _get_pp_rank_to_stage_indices_mapping

    stages = pp * (1 if schedule == "1F1B" else 2)
    for rank in range(pp):
        theirs = _get_pp_rank_to_stage_indices_mapping(rank, pp, schedule, stages)
        assert list(theirs) == stage_placement(TORCH_NAMES[schedule], rank=rank, pp=pp)


def test_recorded_run_splits_as_torchtitan_weighs_the_layers() -> None:
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part

    lines = recorded()
    built = [re.search(r"rank (\d): PP rank (\d) is building stage_idx (\d) with modules (\[.*\])", x)
             for x in lines]  # fmt: skip
    split = {int(m[3]): (int(m[1]), ast.literal_eval(m[4])) for m in built if m}
    expected = _generate_llm_fqn_per_model_part(2, 6, 1, 1)  # 6 layers + 2 weighted as layers
    assert split == {0: (0, expected[0]), 1: (1, expected[1])}
    assert expected[0] == ["tok_embeddings", "layers.0", "layers.1", "layers.2"]
    assert "rank 0: Building device mesh with parallelism: pp=2, dp_replicate=1, dp_shard=1" in (
        "\n".join(lines)
    )


def test_recorded_loss_is_on_the_last_stages_rank_only_and_falls() -> None:
    steps = [re.match(r"rank (\d): step: +(\d+) +loss: +(-?[\d.]+)", x) for x in recorded()]
    by_rank: dict[int, dict[int, float]] = {}
    for m in filter(None, steps):
        by_rank.setdefault(int(m[1]), {})[int(m[2])] = float(m[3])
    assert set(by_rank[0].values()) == {-1.0}, "rank 0 holds no last stage: no loss"
    losses = by_rank[1]
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert losses[6] < losses[1] - 0.3
    assert any("rank 0: Pipeline Parallel loss is not visible" in x for x in recorded())
