"""tinyscale.data_parallel.fully_sharded: ZeRO-3 that hands any torch optimizer its shards,
and fully_sharded_vs_one_process, its demo against one process.

docs/week-4/zero3-any-optimizer.md runs the demo on 2 ranks and CI compares its output
with the recorded one; these tests hold the recorded numbers to one process, to Week 2's
ZeRO-3 and to the bytes formula, check the page's sentences against them, and run what
the demo does not: a data-parallel group smaller than the world, and bad input.
"""

import copy
import math
import re

import torch
import torch.distributed as dist
from torch import nn

from helpers import TIMEOUTS, one_line_error, prose, recorded_output, said
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.config import preset
from tinyscale.core.model import TinyTransformer
from tinyscale.core.parity import flat_parameters, largest_difference
from tinyscale.data_parallel.fully_sharded import FullyShardedModel
from tinyscale.data_parallel.fully_sharded_vs_one_process import LR
from tinyscale.expert_parallel.moe import convert_to_moe, moe_layers
from tinyscale.expert_parallel.moe_routing import MoEConfig

PAGE = "week-4/zero3-any-optimizer.md"
WORLD = 2  # the demo's ranks
# Tolerances, with what the recorded run measures. The ranks average their halves'
# gradients; one process adds the same terms in another order: the last bits differ.
SGD_TOLERANCE = 1e-7  # weights after 3 steps (measured 3.7e-9)
ADAMW_TOLERANCE = 1e-4  # Adam divides by sqrt(v): tiny gradients amplify the bits (1.6e-5)
LOSS_TOLERANCE = 2e-6  # 6 printed decimals: one rounding step either side (measured 1e-6)
GRAD_TOLERANCE = 1e-7  # micro-batches, clipped gradients (measured 1.5e-8, 5.6e-9)
MAX_NORM = 0.1  # the demo's clip_grad_norm_(0.1)


def demo_output() -> list[str]:
    return recorded_output(PAGE, "fully_sharded_vs_one_process import demo")


def number(line: str, pattern: str) -> float:
    found = re.search(pattern, line)
    assert found, (pattern, line)
    return float(found[1])


def test_losses_follow_one_process_at_every_step() -> None:
    rows = [line.split() for line in demo_output() if re.match(r"\d+ ", line)]
    assert [int(r[0]) for r in rows] == [1, 2, 3]
    for row in rows:
        sgd_one, sgd, adamw_one, adamw = map(float, row[1:])
        assert abs(sgd - sgd_one) < LOSS_TOLERANCE and abs(adamw - adamw_one) < LOSS_TOLERANCE
        # random tokens: every loss is near ln(vocabulary), a sanity check of the scale
        assert abs(sgd_one - math.log(preset("tiny").vocab_size)) < 0.1


def test_weights_equal_one_process_and_zero3() -> None:
    (line,) = [x for x in demo_output() if x.startswith("largest weight difference")]
    assert number(line, r"SGD ([\d.e+-]+)") < SGD_TOLERANCE
    assert number(line, r"AdamW ([\d.e+-]+) from one process") < ADAMW_TOLERANCE
    # the same reduce-scatter and torch's AdamW = ZeRO's FlatAdamW, in the same order
    assert number(line, r"AdamW ([\d.e+-]+) from ZeRO-3") == 0.0


def shard_elements(world: int) -> tuple[int, int]:
    """(Ψ, elements one rank holds): each block a unit, the rest the root, padded to N."""
    model = TinyTransformer(preset("tiny"))
    units = [sum(p.numel() for p in block.parameters()) for block in model.blocks]
    units.append(model.num_parameters() - sum(units))
    return model.num_parameters(), sum(math.ceil(n / world) for n in units)


def test_each_rank_holds_one_nth_of_every_state() -> None:
    psi, shard = shard_elements(WORLD)
    expected = {  # fp32: (one process, each rank)
        "weights": (4 * psi, 4 * shard),
        "gradients": (4 * psi, 4 * shard),
        "SGD momentum": (4 * psi, 4 * shard),
        "AdamW m and v": (8 * psi, 8 * shard),
    }
    lines = demo_output()
    assert int(re.search(r"Ψ = ([\d,]+)", lines[0])[1].replace(",", "")) == psi
    for label, (one, mine) in expected.items():
        (line,) = [x for x in lines if x.startswith(label)]
        found = [int(v.replace(",", "")) for v in line[len(label) :].split()]
        assert found == [one] + [mine] * WORLD, label
        assert abs(found[1] * WORLD / found[0] - 1) < 0.02  # 1/N, padding aside
    assert lines[-3] == "full buffers left after the last step: [0, 0]"


def test_micro_batches_and_clipping_match() -> None:
    lines = demo_output()
    assert number(lines[-2], r"largest gradient difference ([\d.e+-]+)") < GRAD_TOLERANCE
    norm = number(lines[-1], r"norm ([\d.]+),")
    assert norm == number(lines[-1], r"torch on one process ([\d.]+)")
    assert norm > MAX_NORM  # so the gradients were really scaled
    assert number(lines[-1], r"differ by ([\d.e+-]+)") < GRAD_TOLERANCE


def test_the_page_says_what_the_run_measured() -> None:
    text, lines = prose(PAGE), demo_output()
    (line,) = [x for x in lines if x.startswith("largest weight difference")]
    sgd, adamw = said(text, r"SGD ends ([\d.e+-]+) from one process and AdamW ([\d.e+-]+)")
    assert f"SGD {sgd}," in line and f"AdamW {adamw} from one process" in line
    (zero,) = said(text, r"and ([\d.e+-]+) from Week 2's ZeRO-3")
    assert f"AdamW {zero} from ZeRO-3" in line
    (micro,) = said(text, r"two micro-batches differ from one batch by ([\d.e+-]+)")
    assert f"difference {micro}" in lines[-2]
    adamw_q, zero_q = said(
        text, r"Why does AdamW end ([\d.e+-]+) from one process but ([\d.]+) from"
    )
    assert adamw_q == adamw and float(zero_q) == float(zero)
    sgd_tol, adamw_tol = said(text, r"The tests allow (\S+) for SGD, (\S+) for AdamW")
    assert (float(sgd_tol), float(adamw_tol)) == (SGD_TOLERANCE, ADAMW_TOLERANCE)


def test_the_page_says_what_a_rank_holds() -> None:
    nbytes, elements, block, root = said(
        prose(PAGE),
        r"([\d,]+) bytes = ([\d,]+) fp32 elements: the shards of two blocks \(([\d,]+) "
        r"parameters each\) and of the root \(([\d,]+)\)",
    )
    model = TinyTransformer(preset("tiny"))
    blocks = {sum(p.numel() for p in b.parameters()) for b in model.blocks}
    assert blocks == {int(block.replace(",", ""))}
    assert model.num_parameters() - 2 * blocks.pop() == int(root.replace(",", ""))
    _, shard = shard_elements(WORLD)
    assert (int(nbytes.replace(",", "")), int(elements.replace(",", ""))) == (4 * shard, shard)


def test_an_optimizer_built_before_wrapping_is_refused() -> None:
    (message,) = recorded_output(PAGE, "optimizer_built_too_early")
    assert message.startswith("AdamW holds the module's full-size parameters")
    assert message.endswith(
        "build the optimizer after wrapping, from fsdp.parameters() (the shards)"
    )


def own_group(steps: int = 2) -> dict[str, float]:
    """Each rank its own data-parallel group of one, its own seed: every collective must stay
    in the group, or the ranks would mix their weights, gradients or shard sizes."""
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = [dist.new_group([r]) for r in range(world)]  # every rank creates every group
    cfg = preset("tiny")
    torch.manual_seed(rank)
    one = TinyTransformer(cfg)
    model = copy.deepcopy(one)
    fsdp = FullyShardedModel(model, units=list(model.blocks), group=groups[rank])
    optimizers = [torch.optim.AdamW(m.parameters(), lr=LR) for m in (one, fsdp)]
    batches = torch.randint(0, cfg.vocab_size, (steps, 2, 2, cfg.max_position_embeddings))
    for x, y in batches:
        for m in (one, fsdp):
            m(x, y)[1].backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    full = fsdp.full_parameters()
    return {
        "vs one process": (full - torch.cat([p.flatten() for p in one.parameters()])).abs().max().item(),
        "sum": full.sum().item(),
    }  # fmt: skip


def test_a_group_smaller_than_the_world() -> None:
    ranks = run_on_ranks(own_group, 2, **TIMEOUTS)
    assert [r["vs one process"] for r in ranks] == [0.0, 0.0]  # N = 1: the same arithmetic
    assert ranks[0]["sum"] != ranks[1]["sum"]  # two groups, two models: nothing leaked


def test_the_wrapper_lists_only_the_shards(process_group_of_one) -> None:
    model = TinyTransformer(preset("tiny"))
    psi = model.num_parameters()
    fsdp = FullyShardedModel(model, units=list(model.blocks))
    shards = list(fsdp.parameters())
    assert len(shards) == 3 and all(
        s is unit.shard for s, unit in zip(shards, fsdp.units, strict=True)
    )
    assert list(model.parameters()) == []  # what the optimizer must not be given
    assert sum(s.numel() for s in shards) == psi  # N = 1: no padding
    assert fsdp.gathered_bytes() == 0


def test_bad_input_gets_one_line(process_group_of_one) -> None:
    message = one_line_error(FullyShardedModel, nn.Linear(2, 2), units=[nn.Linear(2, 2)])
    assert message == (
        "unit Linear is not a submodule of the wrapped Linear: pass units from the module you wrap"
    )
    frozen = nn.Linear(2, 2).requires_grad_(False)
    assert one_line_error(FullyShardedModel, frozen) == (
        "Linear has no trainable parameters: nothing to shard"
    )
    model = nn.Linear(2, 2)
    too_early = torch.optim.SGD(model.parameters(), lr=LR)
    fsdp = FullyShardedModel(model)
    fsdp(torch.ones(1, 2)).sum().backward()
    assert "build the optimizer after wrapping" in one_line_error(too_early.step)
    torch.optim.SGD(fsdp.parameters(), lr=LR).step()  # the shards: accepted


def test_no_process_group() -> None:
    assert not dist.is_initialized()
    assert one_line_error(FullyShardedModel, nn.Linear(2, 2)).startswith(
        "FullyShardedModel needs a process group"
    )


MOE_STEPS = 2
MOE_TOLERANCE = 1e-4  # AdamW amplifies the last bits of small gradients (measured 1.7e-5)


def moe_with_an_idle_expert() -> dict:
    """The tiny model with 4 experts per block, its router forced so that expert 0 gets no
    token: FullyShardedModel (each block a unit) against one process."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = preset("tiny")
    torch.manual_seed(0)
    one = convert_to_moe(TinyTransformer(cfg), MoEConfig(num_experts=4, balance="bias"))
    for layer in moe_layers(one):
        layer.router.bias[0] = -1.0  # chosen by probs + bias, probs <= 1: never expert 0
    model = copy.deepcopy(one)
    fsdp = FullyShardedModel(model, units=list(model.blocks))
    optimizers = [torch.optim.AdamW(m.parameters(), lr=LR) for m in (one, fsdp)]
    tokens = torch.Generator().manual_seed(0)  # the same batches on every rank
    batches = torch.randint(0, cfg.vocab_size, (MOE_STEPS, 2, 2 * world, 16), generator=tokens)
    mine = slice(2 * rank, 2 * rank + 2)
    for x, y in batches:
        one(x, y)[1].backward()
        fsdp(x[mine], y[mine])[1].backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    return {
        "vs one process": largest_difference(fsdp.full_parameters(), flat_parameters(one)),
        "idle expert's load": [layer.load[0].item() for layer in moe_layers(model)],
        "gathered": fsdp.gathered_bytes(),
    }


def test_an_expert_without_tokens_trains_as_on_one_process() -> None:
    for rank in run_on_ranks(moe_with_an_idle_expert, 2, **TIMEOUTS):
        assert rank["idle expert's load"] == [0, 0]  # the router really starved it
        assert rank["vs one process"] < MOE_TOLERANCE
        assert rank["gathered"] == 0
