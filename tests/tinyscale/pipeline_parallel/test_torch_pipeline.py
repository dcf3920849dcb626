"""torch.distributed.pipelining on our stages (tinyscale.pipeline_parallel.torch_pipeline).

One step of each schedule gives the gradients of one process on the same batch, within
PARITY_TOLERANCE: at p = 2 the page's recorded table says so (CI re-runs it), at p = 4
a run here measures it. A pipeline of one rank (both V stages on rank 0) runs in this
process and shows why the loss, not the gradients, is scaled.
"""

import copy
import re

import pytest
import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleZBVZeroBubble

from helpers import TIMEOUTS, one_line_error, recorded_output
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.config import preset
from tinyscale.core.errors import run_cli
from tinyscale.core.model import TinyTransformer, cut_into_stages
from tinyscale.pipeline_parallel.pipeline import split_layers
from tinyscale.pipeline_parallel.torch_pipeline import (
    SCHEDULES,
    build_schedule,
    check_schedule,
    compare_schedules,
    grad_diff,
    last_stage_rank,
    main,
    stage_placement,
    sync_tied_embedding,
    tied_embedding_group,
)

PARITY_TOLERANCE = 1e-6  # fp32: the micro-batches' gradients summed in another order
DEMO = "python -m tinyscale.pipeline_parallel.torch_pipeline"


def test_recorded_table_all_four_schedules_equal_one_process() -> None:
    lines = recorded_output("week-3/pipeline-torchtitan.md", DEMO)
    loss, norm = map(float, re.search(r"loss ([\d.]+), grad norm ([\d.]+)", lines[0]).groups())
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert sorted(rows) == sorted(SCHEDULES)
    for name, (_, per_rank) in SCHEDULES.items():
        row = rows[name]
        assert int(row[1]) == 2 * per_rank
        assert row[2:4] == ["rank", str(last_stage_rank(name, 2))]
        assert (float(row[4]), float(row[5])) == (loss, norm)
        assert " ".join(row[6:]) == "< 1e-6", f"{name}: gradients differ from one process"


def ours_vs_torch(microbatches: int = 4, layers: int = 8) -> dict[str, float]:
    """On every rank: our from-scratch Pipeline and torch's on copies of one model, one step.

    Returns, per schedule both have, the largest |our gradient - torch's| over all ranks.
    """
    from tinyscale.pipeline_parallel.pipeline import Pipeline, PipelineConfig

    rank, pp = dist.get_rank(), dist.get_world_size()
    out = {}
    for name, chunks in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
        torch.manual_seed(0)
        ours = TinyTransformer(preset("tiny", num_hidden_layers=layers))
        theirs = copy.deepcopy(ours)
        x = torch.randint(0, ours.cfg.vocab_size, (8, ours.cfg.max_position_embeddings))
        y = torch.roll(x, -1, dims=1)
        config = PipelineConfig(schedule=name, microbatches=microbatches, chunks=chunks)
        pipe = Pipeline(ours, config=config, batch_shape=tuple(x.shape))
        pipe.step(x, y)
        runner, _ = build_schedule(
            theirs, schedule=name, microbatches=microbatches, group=dist.group.WORLD,
            device=torch.device("cpu"),
        )  # fmt: skip
        runner.step(*((x,) if rank == 0 else ()), target=y)
        sync_tied_embedding(theirs, tied_embedding_group([list(range(pp))], pp - 1))
        torch_params = dict(theirs.named_parameters(remove_duplicate=False))
        diff = max(
            (p.grad - torch_params[n].grad).abs().max().item()
            for n, p in pipe.named_parameters().items()
        )
        worst = torch.tensor(diff)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        out[name] = worst.item()
    return out


def four_ranks() -> dict:
    """Both checks of the p = 4 test in one start of 4 processes (a start costs seconds)."""
    report = compare_schedules(list(SCHEDULES), 4)
    report["ours_vs_torch"] = ours_vs_torch()
    report["untied"] = compare_schedules(["1f1b", "zbv"], 4, tied=False)
    return report


@pytest.fixture(scope="module")
def four() -> dict:
    return run_on_ranks(four_ranks, 4, **TIMEOUTS)[0]


def test_our_from_scratch_pipeline_equals_torchs(four: dict) -> None:
    assert sorted(four["ours_vs_torch"]) == ["1f1b", "gpipe", "interleaved"]
    for name, diff in four["ours_vs_torch"].items():
        assert diff < PARITY_TOLERANCE, name


def test_untied_embeddings_need_no_sync_and_are_counted_in_the_norm(four: dict) -> None:
    r = four["untied"]
    for name in ("1f1b", "zbv"):
        assert r[name]["max_grad_diff"] < PARITY_TOLERANCE, name
        assert r[name]["norm"] == pytest.approx(r["reference_norm"], rel=1e-5), name


def test_four_ranks_every_schedule_equals_one_process(four: dict) -> None:
    r = four
    for name in SCHEDULES:
        assert r[name]["max_grad_diff"] < PARITY_TOLERANCE, name
        assert r[name]["loss"] == pytest.approx(r["reference_loss"], abs=1e-5), name
        assert r[name]["norm"] == pytest.approx(r["reference_norm"], rel=1e-5), name
    assert [r[n]["last_rank"] for n in ("1f1b", "zbv")] == [3, 0]


def one_rank_v(scale_grads: bool) -> float:
    """ZBV with both stages on this one rank: max |grad - one process| after one step."""
    torch.manual_seed(0)
    model = TinyTransformer(preset("tiny", num_hidden_layers=2))
    x = torch.randint(0, 260, (8, 16))
    y = torch.roll(x, -1, dims=1)
    model(x, y)[1].backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    if scale_grads:  # torch's default: each stage divides its own gradients by m
        stages = cut_into_stages(model, split_layers(2, 2))
        wrapped = [PipelineStage(s, i, 2, torch.device("cpu")) for i, s in enumerate(stages)]
        runner = ScheduleZBVZeroBubble(wrapped, n_microbatches=4, loss_fn=TinyTransformer.loss)
    else:
        group = torch.distributed.group.WORLD
        runner, _ = build_schedule(
            model, schedule="zbv", microbatches=4, group=group, device=torch.device("cpu")
        )
    runner.step(x, target=y)
    return max((p.grad - reference[n]).abs().max().item() for n, p in model.named_parameters())


def test_scaling_the_loss_keeps_a_tied_weight_shared_by_two_stages_right(
    process_group_of_one: None,
) -> None:
    assert one_rank_v(scale_grads=False) < PARITY_TOLERANCE
    assert one_rank_v(scale_grads=True) > 1e-3  # the tied matrix divided by m twice


def test_placement_loop_and_v() -> None:
    assert [stage_placement("1f1b", rank=r, pp=4) for r in range(4)] == [[0], [1], [2], [3]]
    assert stage_placement("interleaved", rank=1, pp=2) == [1, 3]
    assert [stage_placement("zbv", rank=r, pp=2) for r in range(2)] == [[0, 3], [1, 2]]


def test_unknown_schedule_names_the_flag_and_the_choices() -> None:
    message = one_line_error(check_schedule, "zb1")
    assert message.startswith("--schedule 'zb1'") and "gpipe, 1f1b, interleaved, zbv" in message


def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, words in ((["--world-size", "1"], "--world-size"),
                        (["--microbatches", "3"], "--microbatches 3"),
                        (["--world-size", "8"], "16 pipeline stages")):  # fmt: skip
        assert run_cli(main, argv) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1, err


def test_grad_diff_reads_alike_below_the_tolerance() -> None:
    assert grad_diff(2.2e-8) == grad_diff(0.0) == "< 1e-6"
    assert grad_diff(3.0e-2) == "3.0e-02"
