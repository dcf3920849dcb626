"""tinyscale.composed.two_d: our tensor parallelism inside our ZeRO-1 data parallelism, on a
2 x 2 grid of gloo ranks. docs/week-4/parallelism-2d-3d.md runs it and CI compares the
output with the recorded one; these tests read that output (no second run) and check:

- the mean loss and the weights after 3 steps equal one process on the whole batch;
- the bytes each rank sends to its tensor group and to its data group are the formulas;
- a rank holds the tensor shard (the TP formula) and about 1/dp of its optimizer state.
"""

import re
from types import SimpleNamespace

import pytest

from helpers import recorded_output
from tinyscale.comm.parallel_layout import ParallelLayout
from tinyscale.composed.two_d import tensor_step_bytes
from tinyscale.core.config import preset
from tinyscale.data_parallel.memory_calculator import (
    activation_bytes_estimate,
    zero_state_bytes,
    zero_step_bytes,
)
from tinyscale.tensor_parallel.tp_model import parameters_per_rank

PAGE = "week-4/parallelism-2d-3d.md"
WEIGHT_TOLERANCE = 1e-3  # Adam after 3 steps, as in test_tensor_parallel.py (measured 3.6e-5)
RANK = re.compile(
    r"rank (\d) \(dp (\d), tp (\d)\): ([\d,]+) parameters, ([\d,]+) optimizer-state elements, "
    r"sends ([\d,]+) B to its tensor group and ([\d,]+) B to its data group per step"
)


def number(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.fixture(scope="module")
def runs() -> list[SimpleNamespace]:
    """The page's run, rank by rank."""
    found = []
    for line in recorded_output(PAGE, "two_d import demo")[:-1]:
        m = RANK.fullmatch(line)
        assert m, line
        found.append(SimpleNamespace(
            coordinate={"dp": int(m[2]), "tp": int(m[3])}, params=number(m[4]),
            state=number(m[5]), tensor_bytes=number(m[6]), data_bytes=number(m[7]),
        ))  # fmt: skip
    return found


def test_two_d_trains_like_one_process(runs) -> None:
    coordinates = [(r.coordinate["dp"], r.coordinate["tp"]) for r in runs]
    assert coordinates == [(0, 0), (0, 1), (1, 0), (1, 1)]  # tp innermost
    last = recorded_output(PAGE, "two_d import demo")[-1]
    assert float(last.rsplit(" ", 1)[1]) < WEIGHT_TOLERANCE  # loss and weights, every rank


def test_bytes_per_group_are_the_formulas(runs) -> None:
    cfg = preset("tiny")
    tensor = tensor_step_bytes(cfg, batch=4, seq_len=cfg.max_position_embeddings, tp=2)
    for r in runs:
        assert r.tensor_bytes == tensor
        assert r.data_bytes == zero_step_bytes(stage=1, numel=r.params, world=2)  # ZeRO-1


def test_memory_per_rank_against_the_calculator(runs) -> None:
    shard = parameters_per_rank(preset("tiny"), 2)
    adam = zero_state_bytes(shard, stage=1, world_size=2).optimizer  # 8 bytes/param, / dp
    for r in runs:
        assert r.params == shard
        assert abs(4 * r.state - adam) <= 8 * 32  # whole parameters: within one 32-vector
    assert sum(r.state for r in runs[:2]) + sum(r.state for r in runs[2:]) == 4 * shard


def test_the_planners_numbers_for_this_run_are_the_measurements(runs) -> None:
    """What planner.evaluate prints for the 2 x 2 CPU run, against what the run measured."""
    from helpers import recorded_output
    from tinyscale.composed.planner import Cluster, Workload, evaluate

    cfg = preset("tiny")
    w = Workload(model=cfg, seq_len=16, global_batch=8, micro_batch=4, precision="fp32")
    p = evaluate(w, Cluster(gpus=4, gpus_per_node=4), ParallelLayout(dp_replicate=2, tp=2), zero=1)
    assert p.microbatches == 1 and p.bubble == 0.0 and p.pipeline_bytes == 0.0
    assert p.params == runs[0].params
    assert p.tensor_bytes == runs[0].tensor_bytes and p.data_bytes == runs[0].data_bytes
    states = [4 * r.params + 4 * r.params + 4 * r.state for r in runs]  # weights, grads, Adam
    assert min(states) <= p.states <= max(states)
    sp = [x for x in recorded_output("week-4/tensor-parallel-from-scratch.md", "tp_parity import demo")
          if x.startswith("TP + SP, t = 2")]  # fmt: skip
    assert f"{p.activations:,} bytes of saved activations" in sp[0]  # measured with SP, t = 2


def test_the_planner_chooses_torchtitans_published_layouts() -> None:
    """7B on 16 GPUs: FSDP alone; 70B on 64: TP 8 x FSDP, as torchtitan's llama3 recipes."""
    pytest.importorskip("torchtitan", reason="torchtitan is in the cluster extra: make setup")
    from torchtitan.models.llama3.config_registry import llama3_8b, llama3_70b

    from tinyscale.composed.planner import Cluster, Workload, plan

    for name, gpus, batch, recipe in [("7b", 16, 64, llama3_8b), ("70b", 64, 128, llama3_70b)]:
        best = plan(Workload(model=preset(name), seq_len=8192, global_batch=batch),
                    Cluster(gpus=gpus))[0]  # fmt: skip
        published = recipe().parallelism
        assert (best.tp, best.pp, best.zero) == (published.tensor_parallel_degree, 1, 3)
        assert published.data_parallel_shard_degree == -1  # FSDP over every rank left


def test_a_model_that_fits_nowhere_is_one_line() -> None:
    from helpers import one_line_error
    from tinyscale.composed.planner import Cluster, Workload, plan

    w = Workload(model=preset("70b"), seq_len=8192, global_batch=8)
    message = one_line_error(plan, w, Cluster(gpus=8))
    assert message.startswith("no layout fits in 80 GB x 0.85; the smallest needs")
    assert message.endswith("raise --gpus or --memory-gb, add --recompute full, or lower --seq-len")
    batch = Workload(model=preset("7b"), seq_len=8192, global_batch=64)  # 12 GPUs: dp 3, 6, 12
    assert one_line_error(plan, batch, Cluster(gpus=12)).startswith(
        "no layout of 12 GPUs takes --global-batch 64: their data-parallel sizes (3, 6, 12)"
    )  # not memory: 64 sequences do not split evenly over any layout's replicas


def test_the_pages_activation_sentence_is_the_calculator() -> None:
    from helpers import prose

    def gib(**split: object) -> float:
        kw = {"micro_batch": 1, "seq_len": 8192, "precision": "bf16"}
        return activation_bytes_estimate(preset("70b"), **kw, **split) / 2**30

    assert f"saves about {round(gib(), -1):.0f} GiB of activations" in prose(PAGE)
    assert f"down to {gib(tensor_parallel=8, sequence_parallel=True):.0f} GiB per GPU" in prose(
        PAGE
    )
