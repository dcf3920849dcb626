"""Context parallelism from scratch (online_softmax, ring_attention, load_balance,
allgather_kv, cp_model) on 4 gloo ranks; docs/week-5/context-parallel.md runs the same demos
on 2 ranks and CI compares their output.

One run_on_ranks launch gathers every fact:

- ring attention (contiguous and head-tail) equals one process's
  F.scaled_dot_product_attention(is_causal=True) in its output and in dq, dk, dv;
- each rank computes the tiles and score entries load_balance.work_formula says: the
  contiguous split's last rank N times the first's, the head-tail split even;
- the next block's messages are posted before the current block is computed (the trace);
- bytes sent (CollectiveCounter) and bytes saved for backward (saved-tensor hooks), for the
  ring and the all-gather, equal their formulas and docs/generated/week5/cp_memory.json;
- the course's model, split by position, gives one process's loss, logits and gradients;
- bad input is refused in one line, before any message.

Then, in one process: the merge rule reproduces SDPA and a wrong merge does not (the check
of the page's "write it yourself" exercise), and a stalled neighbour raises at the timeout.
"""

import json

import pytest
import torch
import torch.distributed as dist

from helpers import ROOT, load_tool, one_line_error, usage_error
from tinyscale.comm.launch import RankFailed, run_on_ranks
from tinyscale.context_parallel import allgather_kv, cp_model, ring_attention
from tinyscale.context_parallel.load_balance import (
    KINDS,
    SequenceSplit,
    imbalance,
    work_formula,
)
from tinyscale.context_parallel.online_softmax import merge, merge_error
from tinyscale.core.config import preset
from tinyscale.core.errors import UsageError
from tinyscale.core.model import TinyTransformer

N = 4  # ranks: the page shows 2
SEQ = 64  # positions: 8 chunks of 8 with head-tail
ATTENTION_TOLERANCE = 1e-5  # output and dq, dk, dv, float32 (measured: 1.2e-6)
LOSS_TOLERANCE = 1e-5  # the model's loss (measured: 4.8e-7)
VALUE_TOLERANCE = 1e-6  # the model's logits and gradients (measured: 1.5e-7)
RECORDED = json.loads((ROOT / "docs" / "generated" / "week5" / "cp_memory.json").read_text())
POINT = 256  # the sequence length re-measured against the recorded json


def misuse() -> dict[str, str | None]:
    q = torch.zeros(1, 2, 8, 4)
    return {
        "shapes": usage_error(lambda: ring_attention.ring_attention(q, q[:, :1], q, split=SequenceSplit(N))),
        "world": usage_error(lambda: ring_attention.ring_attention(q, q, q, split=SequenceSplit(2))),
        "length": usage_error(lambda: ring_attention.ring_attention(q[:, :, :3], q[:, :, :3], q[:, :, :3],
                                                                    split=SequenceSplit(N))),
        "variant": usage_error(lambda: cp_model.context_parallel_attention(q, q, q, split=SequenceSplit(N),
                                                                          variant="ulysses")),
    }  # fmt: skip


def facts() -> dict:
    return {
        "attention": {kind: ring_attention.against_one_process(kind, SEQ) for kind in KINDS},
        "bytes": {
            (variant, t): allgather_kv.measure(variant, t)
            for variant in allgather_kv.VARIANTS
            for t in (SEQ, POINT)
        },
        "model": cp_model.both_variants("headtail")
        | {"contiguous ring": cp_model.parity("contiguous")},
        "misuse": misuse(),
    }


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_on_ranks(facts, N)


@pytest.mark.parametrize("kind", KINDS)
def test_ring_attention_equals_one_process(ranks, kind: str) -> None:
    for rank in ranks:
        diff = rank["attention"][kind]["diff"]
        assert set(diff) == {"out", "dq", "dk", "dv"}
        assert max(diff.values()) < ATTENTION_TOLERANCE, diff


def test_the_work_per_rank_is_the_formula(ranks) -> None:
    seen = {}
    for kind in KINDS:
        split = SequenceSplit(N, kind)
        measured = [(r["attention"][kind]["tiles"], r["attention"][kind]["entries"]) for r in ranks]
        assert measured == [work_formula(split, rank, SEQ) for rank in range(N)]
        seen[kind] = imbalance([entries for _, entries in measured])
    assert seen["contiguous"] == pytest.approx(
        2 * N / (N + 1)
    )  # the last rank: N tiles of mean (N+1)/2
    assert seen["headtail"] == 1.0
    first, last = ranks[0]["attention"]["contiguous"], ranks[-1]["attention"]["contiguous"]
    assert last["tiles"] == N * first["tiles"]


def test_the_next_block_is_posted_before_the_current_one_is_computed(ranks) -> None:
    for rank in ranks:
        trace = rank["attention"]["headtail"]["trace"]
        for step in range(N - 1):
            mine = [
                line.split(": ", 1)[1].split()[0]
                for line in trace
                if line.startswith(f"step {step}:")
            ]
            assert mine == ["post", "compute", "wait"], trace
        last = next(line for line in trace if line.startswith(f"step {N - 1}:"))
        assert last.split()[2] == "compute"


@pytest.mark.parametrize("variant", list(allgather_kv.VARIANTS))
def test_bytes_sent_and_saved_are_the_formulas(ranks, variant: str) -> None:
    for rank in ranks:
        for t in (SEQ, POINT):
            m = rank["bytes"][(variant, t)]
            assert tuple(m["sent"]) == m["sent formula"]
            assert m["saved"] == m["saved formula"]
    kv = 1 * 2 * (SEQ // N) * 16 * 4  # one rank's k: batch 1, 2 heads, T/N positions, 16 channels
    ring, gathered = ranks[0]["bytes"][("ring", SEQ)], ranks[0]["bytes"][("all-gather", SEQ)]
    assert ring["sent formula"] == (2 * (N - 1) * kv, 2 * (N - 1) * kv + 2 * N * kv)
    assert gathered["sent formula"] == (2 * (N - 1) * kv,) * 2
    assert gathered["saved"] - ring["saved"] == 2 * (N - 1) * kv  # all T of k and v, not T/N
    assert ring["ops"] == {"isend": 3 * N - 2, "irecv": 3 * N - 2}
    assert gathered["ops"] == {"all_gather_single": 1, "reduce_scatter_single": 1}


def test_the_recorded_memory_table_is_todays(ranks) -> None:
    for variant in allgather_kv.VARIANTS:
        m = ranks[0]["bytes"][(variant, POINT)]
        (row,) = [
            r
            for r in RECORDED["rows"]
            if (r["world"], r["variant"], r["seq_len"]) == (N, variant, POINT)
        ]
        assert (row["saved"], tuple(row["sent"])) == (m["saved"], tuple(m["sent"]))
    tool = load_tool("figures_week5_cp")
    assert (ROOT / "docs" / "generated" / "week5" / "cp_memory.md").read_text() == tool.table(
        RECORDED["rows"]
    )
    for row in RECORDED["rows"]:
        assert row["saved"] == row["saved formula"] and row["sent"] == row["sent formula"]


@pytest.mark.parametrize("run", ["ring", "all-gather", "contiguous ring"])
def test_the_split_model_matches_one_process(ranks, run: str) -> None:
    for rank in ranks:
        diff = rank["model"][run]
        assert diff["loss"] < LOSS_TOLERANCE, diff
        assert diff["logits"] < VALUE_TOLERANCE and diff["gradients"] < VALUE_TOLERANCE, diff


def test_bad_input_is_one_line_naming_the_fix(ranks) -> None:
    found = ranks[0]["misuse"]
    assert "pass three tensors of one shape" in found["shapes"]
    assert "build SequenceSplit(world=dist.get_world_size())" in found["world"]
    assert "use a multiple of 8" in found["length"]
    assert "use one of ring, all-gather" in found["variant"]
    assert all("\n" not in message for message in found.values())
    assert "use one of contiguous, headtail" in one_line_error(SequenceSplit, 2, "zigzag")
    assert "needs a process group" in one_line_error(
        ring_attention.ring_attention, torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2),
        torch.zeros(1, 1, 4, 2), split=SequenceSplit(1),
    )  # fmt: skip
    dropout = TinyTransformer(preset("tiny", dropout=0.1))
    assert "set dropout=0.0" in one_line_error(
        cp_model.ContextParallelTransformer, dropout, split=SequenceSplit(2)
    )


# --- one process -------------------------------------------------------------------------


def test_the_merge_reproduces_sdpa_and_a_wrong_merge_does_not() -> None:
    assert merge_error(merge) < ATTENTION_TOLERANCE

    def average(out_a, lse_a, out_b, lse_b):  # forgets that the blocks' softmaxes differ
        return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)

    assert merge_error(average) > 1e-2


def test_the_split_is_undone_by_unshard() -> None:
    x = torch.arange(2 * 16).view(2, 16)
    for kind in KINDS:
        split = SequenceSplit(4, kind)
        parts = [split.shard(x, r) for r in range(4)]
        assert torch.equal(split.unshard(parts), x)
    assert SequenceSplit(4, "headtail").positions(1, 16).tolist() == [2, 3, 12, 13]


def stall() -> None:
    """Rank 1 never joins the ring: rank 0's wait must raise at the timeout, not hang."""
    if dist.get_rank() == 0:
        q = torch.zeros(1, 1, 4, 2)
        ring_attention.ring_attention(q, q, q, split=SequenceSplit(2))


def test_a_stalled_neighbour_raises_at_the_timeout() -> None:
    with pytest.raises(RankFailed, match="rank 0 of 2 raised"):
        run_on_ranks(stall, 2, timeout_s=2, deadline_s=30)


def test_a_bad_split_is_refused_before_any_work() -> None:
    with pytest.raises(UsageError, match="use a multiple of 4"):
        SequenceSplit(2, "headtail").positions(0, 6)
