"""tinyscale.composed.three_d: our tensor parallelism inside our pipeline stages inside ZeRO-1
data parallelism, on pp 2 x tp 2, dp 2 x pp 2 (4 gloo ranks) and dp 2 x pp 2 x tp 2 (8).
docs/week-4/parallelism-2d-3d.md runs it and CI compares the output with the recorded one;
these tests read that output (no second run) and check:

- the loss at every step equals one process on the whole batch (and the parity ladder's);
- the bytes each rank sends per step to each group (tp, pp, tied, dp) are the formulas;
- each rank's parameters, Adam state and saved activations are the formulas and the
  memory calculator's;
- the page's sentences quote those numbers; bad grids are one-line errors.
"""

import re
from types import SimpleNamespace

import pytest
import torch

from helpers import one_line_error, prose, recorded_output
from tinyscale.comm.parallel_layout import ParallelLayout
from tinyscale.composed.three_d import (
    SHAPES,
    check_3d,
    formulas,
    pipeline_step_bytes,
    stage_parameters,
    stage_tensor_bytes,
)
from tinyscale.composed.two_d import tensor_step_bytes
from tinyscale.core.config import preset
from tinyscale.data_parallel.memory_calculator import activation_bytes_estimate
from tinyscale.pipeline_parallel.pipeline import split_layers
from tinyscale.tensor_parallel.tp_model import parameters_per_rank

PAGE = "week-4/parallelism-2d-3d.md"
LOSS_TOLERANCE = 1e-6  # measured: 4.8e-7, 0 and 9.5e-7 (one and two float32 spacings at 5.5)
WEIGHT_TOLERANCE = 1e-3  # Adam after 3 steps, as in test_two_d.py (measured 4e-5)
BATCH, MICRO_BATCH = 8, 2
SHAPE = re.compile(
    r"dp (\d) x pp (\d) x tp (\d): loss ([\d.  ]+), largest difference from one process (\S+)"
)
RANK = re.compile(
    r"(\d) +\((\d), (\d), (\d)\) +(\d) +([\d,]+) +([\d,]+) +([\d,]+) x (\d) +([\d,]+) +([\d,]+) "
    r"+([\d,]+) +([\d,]+)"
)
FORMULA = re.compile(r"formulas, stage (\d)" + r" +([\d,]+)" * 6)
TOTAL = re.compile(
    r"one micro-batch's activations, all stages: ([\d,]+) B, calculator ([\d,]+) B; "
    r"weights after 3 steps within (\S+)"
)
SENT = ("tp", "pp", "tied", "dp")


def number(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.fixture(scope="module")
def shapes() -> list[SimpleNamespace]:
    """The page's three runs, rank by rank."""
    found: list[SimpleNamespace] = []
    for line in recorded_output(PAGE, "three_d import demo")[1:]:
        if m := SHAPE.fullmatch(line):
            grid = ParallelLayout(pp=int(m[2]), dp_replicate=int(m[1]), tp=int(m[3]))
            losses = [float(x) for x in m[4].split()]
            found.append(SimpleNamespace(grid=grid, losses=losses, loss=float(m[5]), ranks=[],
                                         formulas={}))  # fmt: skip
        elif m := RANK.fullmatch(line):
            found[-1].ranks.append(SimpleNamespace(
                rank=int(m[1]), coordinate=(int(m[2]), int(m[3]), int(m[4])), block=int(m[5]),
                params=number(m[6]), state=number(m[7]), activations=number(m[8]),
                peak=int(m[9]), sent=dict(zip(SENT, map(number, m.groups()[9:]), strict=True)),
            ))  # fmt: skip
        elif m := FORMULA.fullmatch(line):
            found[-1].formulas[int(m[1])] = [number(x) for x in m.groups()[1:]]
        else:
            m = TOTAL.fullmatch(line)
            assert m, line
            found[-1].activations, found[-1].calculator = number(m[1]), number(m[2])
            found[-1].weights = float(m[3])
    return found


def test_the_page_runs_every_shape_on_its_grid(shapes) -> None:
    assert [(s.grid.dp_replicate, s.grid.pp, s.grid.tp) for s in shapes] == list(SHAPES)
    for s in shapes:
        assert [r.rank for r in s.ranks] == list(range(s.grid.world_size))
        for r in s.ranks:  # pp outermost, tp innermost: rank = (p * dp + d) * tp + t
            where = s.grid.coordinate(r.rank)
            assert r.coordinate == (where["pp"], where["dp_replicate"], where["tp"])
            assert r.block == r.coordinate[0]  # 2 blocks, 2 stages: block p on stage p


def test_3d_trains_like_one_process(shapes) -> None:
    ladder = recorded_output(PAGE, "ladder import demo")
    assert ladder[1].startswith("one process")
    one_process = [float(x) for x in ladder[1].split()[3:6]]  # the ladder's curve
    for s in shapes:
        assert s.loss < LOSS_TOLERANCE
        printed = zip(s.losses, one_process, strict=True)  # 6 decimals: within 1 in the last
        assert max(abs(a - b) for a, b in printed) < 1.5e-6
        assert s.weights < WEIGHT_TOLERANCE


def test_bytes_per_group_are_the_formulas(shapes) -> None:
    cfg = preset("tiny")
    for s in shapes:
        for r in s.ranks:
            f = formulas(cfg, s.grid, r.coordinate[0], batch=BATCH)
            assert r.sent == {k: f[k] for k in SENT}, (s.grid, r.rank)
            assert s.formulas[r.coordinate[0]] == [
                f["params"], f["Adam"], f["tp"], f["pp"], f["tied"], f["dp"]
            ]  # fmt: skip


def test_the_stage_formulas_add_up_to_the_whole_models() -> None:
    """Summed over the stages, the tensor bytes are Step 3's formula for the whole model, and
    at pp 1 a stage's parameters are TensorParallelTransformer's."""
    cfg = preset("tiny", num_hidden_layers=4)
    for pp in (1, 2, 4):
        for tp in (1, 2, 4):
            stages = split_layers(cfg.num_hidden_layers, pp)
            ends = [{"first": s == 0, "last": s == pp - 1} for s in range(pp)]
            tensor = sum(stage_tensor_bytes(cfg, layers, **e, batch=4, seq_len=16, tp=tp)
                         for layers, e in zip(stages, ends, strict=True))  # fmt: skip
            assert tensor == tensor_step_bytes(cfg, batch=4, seq_len=16, tp=tp)
            params = sum(stage_parameters(cfg, layers, **e, tp=tp)
                         for layers, e in zip(stages, ends, strict=True))  # fmt: skip
            tied_copy = 0 if pp == 1 else cfg.vocab_size * cfg.hidden_size // tp
            assert params == parameters_per_rank(cfg, tp) + tied_copy
            sent = sum(pipeline_step_bytes(cfg, **e, batch=4, seq_len=16) for e in ends)
            assert sent == 2 * (pp - 1) * 4 * 16 * cfg.hidden_size * 4  # per boundary, each way


def test_memory_per_rank_against_the_calculator(shapes) -> None:
    cfg = preset("tiny")
    for s in shapes:
        largest = cfg.vocab_size * cfg.hidden_size // s.grid.tp  # the embedding's rows
        for r in s.ranks:
            f = formulas(cfg, s.grid, r.coordinate[0], batch=BATCH)
            assert r.params == f["params"]
            # ZeRO-1 owns whole parameters: within one parameter's 2 Adam moments of 1/dp
            assert abs(r.state - f["Adam"]) <= (2 * largest if s.grid.dp_replicate > 1 else 0)
            assert r.peak == s.grid.pp - r.coordinate[0]  # 1F1B: stage p holds pp - p
        for stage in range(s.grid.pp):  # the dp copies of a stage hold its Adam state once
            copies = [r.state for r in s.ranks if (r.coordinate[0], r.coordinate[2]) == (stage, 0)]
            assert sum(copies) == 2 * s.formulas[stage][0]
        calculator = activation_bytes_estimate(cfg, micro_batch=MICRO_BATCH, seq_len=16,
                                               tensor_parallel=s.grid.tp)  # fmt: skip
        one_per_stage = {r.coordinate[0]: r.activations for r in s.ranks}
        assert sum(one_per_stage.values()) == s.activations == s.calculator == calculator


def test_the_pages_sentences_are_the_run(shapes) -> None:
    text = prose(PAGE)
    by = {(s.grid.dp_replicate, s.grid.pp, s.grid.tp): s for s in shapes}
    worst = max(s.loss for s in shapes)
    spacings = round(worst / (torch.finfo(torch.float32).eps * 4))  # float32 spacing at 5.5
    count = {1: "one float32 spacing", 2: "two float32 spacings"}[spacings]
    assert f"within {worst:.1e} ({count} near 5.5)" in text
    assert f"within {max(s.weights for s in shapes):.0e}, the same Adam effect" in text
    pp_tp = by[(1, 2, 2)].ranks
    stage_1 = pp_tp[2].sent
    assert f"{stage_1['tp']:,} bytes on stage 1 at tp 2 against {stage_1['pp']:,}" in text
    dp_pp = by[(2, 2, 1)].ranks
    params = pp_tp[0].params / dp_pp[0].params  # a stage at tp 2 against tp 1: not a half
    assert f"parameters to {params:.2f} of tp 1's ({dp_pp[0].params:,} at tp 1, " in text
    assert f"{pp_tp[0].params:,} at tp 2: the norms" in text
    activations = pp_tp[0].activations / dp_pp[0].activations
    assert f"saved activations to {activations:.2f} ({dp_pp[0].activations:,} bytes, " in text
    assert f"then {pp_tp[0].activations:,}: without sequence parallelism" in text
    three = by[(2, 2, 2)].ranks
    assert (f"({pp_tp[0].state:,} elements at dp 1, {three[0].params:,} at dp 2 with tp 2, "
            "within one parameter") in text  # fmt: skip
    assert (f"({by[(1, 2, 2)].activations:,} bytes at tp 2, {by[(2, 2, 1)].activations:,} "
            "at tp 1)") in text  # fmt: skip
    peaks = f"stage 0 holds {pp_tp[0].peak} micro-batches at once and stage 1 holds {pp_tp[2].peak}"
    assert peaks in text
    assert f"{pp_tp[0].sent['pp']:,} bytes per rank at tp 2" in text
    tied = (pp_tp[0].sent["tied"], dp_pp[0].sent["tied"])
    assert f"{tied[0]:,} bytes per step at tp 2, half of the {tied[1]:,} at tp 1" in text


def test_bad_grids_are_one_line_before_any_process_waits() -> None:
    def check(layout: ParallelLayout, world: int = 4, batch: int = 8) -> None:
        check_3d(preset("tiny"), layout, world=world, batch=batch, micro_batch=2)

    too_many = one_line_error(check, ParallelLayout(pp=2, dp_replicate=2, tp=2))
    assert too_many.startswith("--pp 2 --dp 2 --tp 2 give 8 ranks but the job has 4")
    assert "use at most 2 stages" in one_line_error(check, ParallelLayout(pp=4))
    assert "use a size that divides it" in one_line_error(check, ParallelLayout(tp=3), world=3)
    message = one_line_error(check, ParallelLayout(pp=2, dp_replicate=2), batch=6)
    assert message.endswith("use a batch that dp x micro-batch divides")
