"""The planner's context-parallel degree: the ring's bytes, the activations at T/cp, and
the worked case of docs/week-5/context-parallel.md (cp > 1 only when sequences are long)."""

import dataclasses

from tinyscale.comm.parallel_layout import ParallelLayout
from tinyscale.composed.planner import Cluster, Workload, evaluate, layouts, main, plan
from tinyscale.context_parallel.allgather_kv import sent_bytes_formula
from tinyscale.core.config import preset
from tinyscale.data_parallel.memory_calculator import (
    activation_bytes_estimate,
    activation_peak_bytes,
)

LONG = Workload(model=preset("7b", max_position_embeddings=131072), seq_len=131072,
                global_batch=16)  # fmt: skip
LAYOUT = ParallelLayout(dp_shard=2, cp=2, tp=4)


def test_the_cp_bytes_are_the_context_parallel_formula() -> None:
    p = evaluate(LONG, Cluster(gpus=16), LAYOUT, zero=3)
    kv = 1 * (131072 // 2) * 4096 // 4 * 2  # b x T/cp x h/tp, bf16
    forward, backward = sent_bytes_formula("ring", 2, kv)
    assert p.context_bytes == p.microbatches * 32 * (forward + backward)
    one = evaluate(LONG, Cluster(gpus=16), dataclasses.replace(LAYOUT, cp=1, dp_shard=4), zero=3)
    assert one.context_bytes == 0


def test_activations_at_cp_2_are_the_estimate_at_half_the_sequence() -> None:
    p = evaluate(LONG, Cluster(gpus=16), LAYOUT, zero=3)
    shape = dict(micro_batch=1, seq_len=131072 // 2, precision="bf16", tensor_parallel=4,
                 sequence_parallel=True)  # fmt: skip
    acts = activation_bytes_estimate(LONG.model, **shape)
    again = activation_peak_bytes(LONG.model, **shape) - acts
    ring = 5 * 2 * (131072 // 2) * 4096 // 4 * 2  # five (k, v) blocks of T/cp positions
    assert p.activations == acts + again + ring  # pp = 1: one micro-batch held


def test_the_worked_case_picks_cp_only_for_long_sequences() -> None:
    best = plan(LONG, Cluster(gpus=16))
    assert {p.cp for p in best} == {4} and best[0].tp == 4  # the page's sentence
    assert all(evaluate(LONG, Cluster(gpus=16), layout, zero=z).memory > 80e9 * 0.85
               for layout, z in layouts(LONG, Cluster(gpus=16)) if layout.cp == 1)  # fmt: skip
    short = Workload(model=preset("7b"), seq_len=8192, global_batch=64)
    assert {p.cp for p in plan(short, Cluster(gpus=16))} == {1}


def test_a_seq_len_that_head_tail_cannot_split_skips_cp(capsys) -> None:
    odd = Workload(model=preset("7b"), seq_len=8188, global_batch=64)  # 8188 = 4 x 2047: cp 2 only
    assert {layout.cp for layout, _ in layouts(odd, Cluster(gpus=16))} == {1, 2}
    assert main(["--model", "7b", "--gpus", "16", "--seq-len", "8191", "--global-batch", "64",
                 "--top", "1"]) == 0  # fmt: skip
    assert "cp" not in capsys.readouterr().out  # odd: no cp at all, and no error
