"""The pipeline runtime (tinyscale.pipeline_parallel.pipeline, .p2p) against one process, on gloo.

One run_on_ranks launch per pipeline degree (p = 2 and 4) runs every schedule for
m = 1, 2, 4, 8 (interleaved: the m that are multiples of p, with v = 2) and returns facts;
the tests assert:

- parity: after 2 SGD steps, tied embeddings (all-reduced) and untied (m = 4),
  every rank's weights and last gradients are within PARITY_TOLERANCE of one process on
  the whole batch, and the last stage's loss is the single process's;
- memory: the micro-batches whose activations autograd holds, counted with saved-tensor
  hooks, peak at what the schedule's list says: m for GPipe, min(p - rank, m) for 1F1B;
- traffic: each stage boundary moves 2 × (B/m)·T·C·4 bytes per micro-batch (activation
  forward, gradient back); the tied embedding adds one all-reduce on ranks 0 and p - 1;
- bubble (p = 2): with stand-in compute (sleep 20 ms forward, 40 ms backward) the idle
  share measured on real processes is within 30 % of the simulator's, fed with the run's
  own action times and message delay (the overhead), in the closer of 2 timed runs; with
  neither overhead, the simulator gives the formula exactly;
- p2p: a missing peer is a one-line timeout that names who waited for what.
"""

import json

import pytest

from helpers import ROOT, assert_timing, one_line_error, prose, said
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.config import preset
from tinyscale.core.errors import UsageError
from tinyscale.pipeline_parallel.p2p import ACTIVATION, StageLink, missing_peer
from tinyscale.pipeline_parallel.pipeline import (
    PipelineConfig,
    check_pipeline,
    compare_with_one_process,
    split_layers,
)
from tinyscale.pipeline_parallel.schedules import (
    SCHEDULES,
    bubble,
    bubble_fraction,
    make_schedule,
    message_delay,
    peak_in_flight,
    simulate,
)

# The same sums in another order: micro-batch gradients accumulate one by one, the single
# process sums all rows at once. Measured after 2 SGD steps (lr 0.1): up to ~1e-7 (fp32).
PARITY_TOLERANCE = 1e-5
MS = (1, 2, 4, 8)
SLEEP = (0.02, 0.04, 0.0)  # stand-in compute: t_f = 20 ms, t_b = 40 ms
# Relative. Quiet, the runs land within 10 %; with the suite's two workers beside them they
# measured 12-14 % (wake-ups the median message delay does not capture). 30 % still tells
# GPipe's 0.2 at p = 2, m = 4 from the naive schedule's 0.5 and from no bubble at all.
BUBBLE_TOLERANCE = 0.30
# Timed twice, judged on the closer run: another process taking the CPU while a rank waits
# delays its wake-up by more than the median message (seen once in ~6 runs at load 8 on 2
# cores); a schedule or a formula that is wrong misses in both runs.
TIMED_RUNS = 2
BATCH, SEQ, HIDDEN = 8, preset("tiny").max_position_embeddings, preset("tiny").hidden_size


def cases(p: int) -> list[tuple[str, int]]:
    return [(s, m) for s in SCHEDULES for m in MS if s != "interleaved" or m % p == 0]


def facts(p: int) -> dict:
    """Everything the tests check, from one launch of p ranks."""
    out: dict = {}
    for name, m in cases(p):
        v = 2 if name == "interleaved" else 1
        r = compare_with_one_process(PipelineConfig(schedule=name, microbatches=m, chunks=v),
                                     layers=2 * p, batch_size=BATCH)  # fmt: skip
        out[name, m] = r | {"events": None}
    for name in SCHEDULES if p == 2 else ():  # untied embeddings: no all-reduce at all
        v = 2 if name == "interleaved" else 1
        r = compare_with_one_process(PipelineConfig(schedule=name, microbatches=4, chunks=v),
                                     layers=2 * p, tied=False)  # fmt: skip
        out[name, "untied"] = r | {"events": None}
    if p == 2:
        for name in ("gpipe", "1f1b"):  # the measured bubble: events of the 2nd step
            cfg = PipelineConfig(schedule=name, microbatches=4, sleep=SLEEP)
            runs = [compare_with_one_process(cfg, layers=2)["events"] for _ in range(TIMED_RUNS)]
            out[name, "timed"] = runs
        out["missing_peer"] = missing_peer()
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=["p2", "p4"])
def run(request) -> tuple[int, list[dict]]:
    return request.param, run_on_ranks(facts, request.param, request.param, deadline_s=240)


def test_every_schedule_matches_one_process(run) -> None:
    p, ranks = run
    untied = [(s, "untied") for s in SCHEDULES] if p == 2 else []
    assert p == 4 or len(untied) == len(SCHEDULES)
    for key in [*cases(p), *untied]:
        for rank, r in enumerate(ranks):
            assert r[key]["weights"] < PARITY_TOLERANCE, (p, key, rank, r[key]["weights"])
            assert r[key]["grads"] < PARITY_TOLERANCE, (p, key, rank, r[key]["grads"])
            assert (r[key]["loss"] is None) == (rank != p - 1)  # only the last stage has it
        assert ranks[-1][key]["loss"] < PARITY_TOLERANCE


def test_activations_alive_peak_as_the_schedule_says(run) -> None:
    p, ranks = run
    for name, m in cases(p):
        v = 2 if name == "interleaved" else 1
        lists = make_schedule(name, p=p, m=m, v=v)
        got = [r[name, m]["peak"] for r in ranks]
        assert got == [peak_in_flight(a) for a in lists], (name, m, got)
        if name == "gpipe":
            assert got == [m] * p
        if name == "1f1b":
            assert got == [min(p - rank, m) for rank in range(p)]


def test_bytes_per_stage_boundary_are_2_b_t_c_4_per_micro_batch(run) -> None:
    p, ranks = run
    for name, m in cases(p):
        stages = p * (2 if name == "interleaved" else 1)
        per_microbatch = 2 * (BATCH // m) * SEQ * HIDDEN * 4  # activation + gradient, fp32
        sent = sum(r[name, m]["sent"] for r in ranks)
        assert sent == (stages - 1) * m * per_microbatch, (name, m)
        tied = [r[name, m]["all_reduced"] for r in ranks]  # tok_emb's gradient, ranks 0 and p-1
        vocab = preset("tiny").vocab_size
        assert tied == [vocab * HIDDEN * 4] + [0] * (p - 2) + [vocab * HIDDEN * 4]
    for name in SCHEDULES if p == 2 else ():
        assert all(r[name, "untied"]["all_reduced"] == 0 for r in ranks)


def test_measured_bubble_is_the_simulators_within_tolerance(run) -> None:
    p, ranks = run
    if p != 2:
        pytest.skip("measured in the p = 2 launch")
    lists = {name: make_schedule(name, p=p, m=4) for name in ("gpipe", "1f1b")}
    for acts in lists.values():  # with no overhead, the simulator gives the formula
        nominal = bubble(simulate(acts, t_f=SLEEP[0], t_b=SLEEP[1]))
        assert nominal == pytest.approx([float(bubble_fraction(p, 4))] * p, abs=1e-12)
    for name, acts in lists.items():
        gaps = []
        for k in range(TIMED_RUNS):
            timeline = [r[name, "timed"][k] for r in ranks]
            for e in (e for r in timeline for e in r):
                assert e.end - e.start >= SLEEP["FB".index(e.action.kind)]
            # the overhead, measured: each action's real time (sleep + compute) and the
            # median delay of a message between ranks, replayed by the simulator
            want = bubble(simulate(acts, t_comm=message_delay(timeline), replay=timeline))
            gaps.append(max(abs(b / w - 1) for b, w in zip(bubble(timeline), want, strict=True)))
        assert min(gaps) < BUBBLE_TOLERANCE, (name, gaps)


def test_the_recorded_1f1b_timeline_runs_again_at_its_speed(run) -> None:
    """The cheap point of tools/figures_week3_pipeline.py: this launch's timed 1F1B step
    (p = 2, m = 4) against the step the simulator predicts from the recorded durations."""
    p, ranks = run
    if p != 2:
        pytest.skip("measured in the p = 2 launch")
    d = json.loads((ROOT / "docs" / "generated" / "week3" / "pipeline_1f1b.json").read_text())
    assert tuple(d["sleep_s"]) == SLEEP
    fresh = max(e.end for r in ranks for e in r["1f1b", "timed"][-1])
    t = d["mean_action_s"]
    lists = make_schedule("1f1b", p=p, m=4)
    sim = simulate(lists, t_f=t["F"], t_b=t["B"], t_comm=d["message_delay_s"])
    want = max(x.end for r in sim for x in r)
    assert_timing(fresh, want, "sleep", "pipeline 1f1b step")
    assert fresh >= (4 + p - 1) * (SLEEP[0] + SLEEP[1])  # m + p - 1 slots of sleep at least


def test_a_missing_peer_is_a_one_line_timeout(run) -> None:
    p, ranks = run
    if p != 2:
        pytest.skip("checked in the p = 2 launch")
    assert ranks[1]["missing_peer"] == (
        "rank 1 waited 1 s for the activation of micro-batch 0 from rank 0: that rank is "
        "missing, crashed or runs another schedule"
    )


def test_a_micro_batch_of_another_shape_is_refused_before_sending() -> None:
    link = StageLink(shape=(2, 16, 32), microbatches=4)
    message = one_line_error(
        link.send, __import__("torch").zeros(3, 16, 32), to=1, kind=ACTIVATION, stage=1, mb=0
    )
    assert "stage 0 sends torch.float32 (3, 16, 32), the stages agreed on" in message


def test_split_layers_covers_every_block_once() -> None:
    assert split_layers(8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert split_layers(5, 2) == [range(0, 3), range(3, 5)]


@pytest.mark.parametrize(
    ("call", "message"),
    [(lambda: split_layers(4, 8), "8 pipeline stages but the model has 4 blocks: use at most 4"),
     (lambda: check_pipeline(PipelineConfig(), world=2, degree=4, batch_size=8),
      "pipeline degree 4 needs 4 processes, the world has 2"),
     (lambda: check_pipeline(PipelineConfig(), world=6, degree=4, batch_size=8),
      "world size 6 is not a multiple of the pipeline degree 4"),
     (lambda: check_pipeline(PipelineConfig(), world=4, degree=2, batch_size=8),
      "use --pipeline-degree 4"),
     (lambda: check_pipeline(PipelineConfig(microbatches=3), world=2, degree=2, batch_size=8),
      "batch size 8 is not divisible by --microbatches 3"),
     (lambda: check_pipeline(PipelineConfig(schedule="zigzag"), world=2, degree=2, batch_size=8),
      "unknown schedule 'zigzag'"),
     (lambda: check_pipeline(PipelineConfig(schedule="interleaved", microbatches=2, chunks=2),
                             world=4, degree=4, batch_size=8),
      "interleaved needs the micro-batches \\(2\\) to be a multiple")],
)  # fmt: skip
def test_bad_input_is_a_one_line_usage_error(call, message) -> None:
    with pytest.raises(UsageError, match=message) as err:
        call()
    assert "\n" not in str(err.value)


def test_the_page_states_the_tests_tolerance() -> None:
    (tolerance,) = said(
        prose("week-3/pipeline-from-scratch.md"), r"Every schedule ends \*\*within ([\de.-]+)\*\*"
    )
    assert float(tolerance) == PARITY_TOLERANCE
