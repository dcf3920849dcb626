"""tinyscale.data_parallel.sharded_optimizer: ZeRO-1 around any torch.optim class, against
torch's ZeroRedundancyOptimizer and one process (the 2D page shows the same at N = 2).

And what real parameters need, on 2 ranks (one launch): LoRA (every base weight frozen)
against one process, dict parameter groups with an LR scheduler against torch's AdamW,
and a checkpoint round trip of every rank's shard, bit for bit. The frozen bias and the
unused branch: test_unused_and_frozen.py."""

import copy
import io

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from helpers import TIMEOUTS, usage_error
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.config import preset
from tinyscale.core.errors import UsageError
from tinyscale.core.model import TinyTransformer
from tinyscale.core.parity import flat_parameters, largest_difference
from tinyscale.data_parallel.sharded_optimizer import ShardedOptimizer, against_torch, partition
from tinyscale.workflows.lora import LoRAConfig, add_lora

ADAMW_TOLERANCE = 1e-4  # averaged gradients add in another order; Adam amplifies (1.3e-5)
SGD_TOLERANCE = 1e-7  # (measured 3.7e-9)


def both(world: int) -> dict:
    return {name: against_torch(name) for name in ("AdamW", "SGD")}


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_on_ranks(both, 4, 4)


@pytest.mark.parametrize(
    ("name", "tolerance"), [("AdamW", ADAMW_TOLERANCE), ("SGD", SGD_TOLERANCE)]
)
def test_equal_to_torchs_zero_and_to_one_process(ranks, name, tolerance) -> None:
    for rank in ranks:
        assert rank[name]["ours vs torch"] == 0.0  # the same partition, the same arithmetic
        assert rank[name]["ours vs one process"] < tolerance


def test_each_rank_holds_about_a_quarter_of_the_state(ranks) -> None:
    params = ranks[0]["SGD"]["params"]
    momentum = [rank["SGD"]["state"] for rank in ranks]  # one buffer per parameter
    assert sum(momentum) == params
    largest = preset("tiny").vocab_size * preset("tiny").hidden_size  # the embedding, 8,320
    assert max(momentum) - min(momentum) <= largest  # greedy: never more than one parameter
    assert max(momentum) == largest  # here the embedding alone is one rank's share
    assert [rank["AdamW"]["state"] for rank in ranks] == [2 * m for m in momentum]


def test_partition_is_greedy_by_size() -> None:
    assert partition([10, 1, 1, 8], 2) == [0, 1, 1, 1]
    with pytest.raises(UsageError, match="3 parameters cannot give each of 4 ranks one to own"):
        partition([1, 2, 3], 4)


# --- what real parameters need: LoRA, dict groups, a checkpoint (one launch of 2 ranks) ---

ROUND_TRIP_STEPS = 2  # trained before the checkpoint, and again after it


def small_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: range, *, half: bool) -> None:
    """MSE on fixed data: the whole batch on one process, or this rank's half of it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in steps:
        data = torch.Generator().manual_seed(step)
        x, y = torch.randn(2 * world, 4, generator=data), torch.randn(2 * world, 2, generator=data)
        if half:
            x, y = x[2 * rank : 2 * rank + 2], y[2 * rank : 2 * rank + 2]
        F.mse_loss(model(x), y).backward()
        if isinstance(optimizer, ShardedOptimizer):
            optimizer.reduce_gradients()
        optimizer.step()
        optimizer.zero_grad()
        for scheduler in getattr(optimizer, "schedulers", []):
            scheduler.step()


def lora_against_one_process(steps: int = 2) -> float:
    """LoRA on the tiny model: every base weight frozen, the adapters trained under ZeRO-1."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = preset("tiny")
    torch.manual_seed(0)
    one = TinyTransformer(cfg)
    add_lora(one, LoRAConfig(rank=2))
    model = copy.deepcopy(one)
    optimizers = [torch.optim.AdamW(one.parameters(), lr=1e-2),
                  ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2)]  # fmt: skip
    tokens = torch.Generator().manual_seed(0)  # the same batches on every rank
    batches = torch.randint(0, cfg.vocab_size, (steps, 2, 2 * world, 16), generator=tokens)
    mine = slice(2 * rank, 2 * rank + 2)
    for x, y in batches:
        one(x, y)[1].backward()
        model(x[mine], y[mine])[1].backward()
        optimizers[1].reduce_gradients()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    return largest_difference(model, one)


def groups(model: nn.Sequential) -> list[dict]:
    """Weights decayed, biases not and at half the learning rate: two dict groups."""
    return [{"params": [model[0].weight, model[2].weight], "weight_decay": 0.1},
            {"params": [model[0].bias, model[2].bias], "weight_decay": 0.0, "lr": 5e-3}]  # fmt: skip


def groups_against_one_process(steps: int = 3) -> dict:
    """Dict parameter groups and an LR scheduler, on ZeRO-1 and on one process."""
    one, model = small_model(), small_model()
    optimizers = [torch.optim.AdamW(groups(one), lr=1e-2),
                  ShardedOptimizer(groups(model), torch.optim.AdamW, lr=1e-2)]  # fmt: skip
    for optimizer in optimizers:
        optimizer.schedulers = [torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5**s)]
    train(one, optimizers[0], range(steps), half=False)
    train(model, optimizers[1], range(steps), half=True)
    return {
        "vs one process": largest_difference(model, one),
        "lrs": [[g["lr"] for g in o.param_groups] for o in optimizers],
        "weight decay": [[g["weight_decay"] for g in o.param_groups] for o in optimizers],
    }


def checkpoint_round_trip() -> dict:
    """Train, save every rank's shard, train on; then restore into new objects and train the
    same steps again: the same weights, bit for bit."""
    model = small_model()
    optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2)
    train(model, optimizer, range(ROUND_TRIP_STEPS), half=True)
    weights, shard = copy.deepcopy(model.state_dict()), io.BytesIO()
    torch.save(optimizer.state_dict(), shard)  # this rank's file
    later = range(ROUND_TRIP_STEPS, 2 * ROUND_TRIP_STEPS)
    train(model, optimizer, later, half=True)
    restored, fresh = small_model(), small_model()
    for m in (restored, fresh):
        m.load_state_dict(weights)
    optimizers = [
        ShardedOptimizer(m.parameters(), torch.optim.AdamW, lr=1e-2) for m in (restored, fresh)
    ]
    shard.seek(0)
    optimizers[0].load_state_dict(torch.load(shard, weights_only=True))
    for m, o in zip((restored, fresh), optimizers, strict=True):
        train(m, o, later, half=True)
    shards = [None] * dist.get_world_size()
    dist.all_gather_object(shards, optimizer.state_dict())
    other = shards[1 - dist.get_rank()]
    return {
        "same": torch.equal(flat_parameters(restored), flat_parameters(model)),
        "fresh differs": not torch.equal(flat_parameters(fresh), flat_parameters(model)),
        "state tensors": sum(
            torch.is_tensor(v) for s in shard_state(optimizer) for v in s.values()
        ),
        "other rank's shard": usage_error(lambda: optimizers[1].load_state_dict(other)),
        "is an Optimizer": isinstance(optimizer, torch.optim.Optimizer),
    }


def shard_state(optimizer: ShardedOptimizer) -> list[dict]:
    return list(optimizer.state_dict()["state"].values())


def zero1_facts() -> dict:
    return {"lora": lora_against_one_process(), "groups": groups_against_one_process(),
            "checkpoint": checkpoint_round_trip()}  # fmt: skip


@pytest.fixture(scope="module")
def zero1() -> list[dict]:
    return run_on_ranks(zero1_facts, 2, **{**TIMEOUTS, "deadline_s": 240.0})


def test_lora_adapters_train_as_on_one_process(zero1) -> None:
    assert all(rank["lora"] < ADAMW_TOLERANCE for rank in zero1)


def test_dict_groups_keep_their_own_settings(zero1) -> None:
    for rank in zero1:
        facts = rank["groups"]
        assert facts["vs one process"] < ADAMW_TOLERANCE
        assert facts["lrs"][1] == facts["lrs"][0] == [1e-2 * 0.5**3, 5e-3 * 0.5**3]
        assert facts["weight decay"][1] == facts["weight decay"][0] == [0.1, 0.0]


def test_a_checkpoint_round_trip_gives_the_same_steps_bit_for_bit(zero1) -> None:
    for rank, facts in enumerate(r["checkpoint"] for r in zero1):
        assert facts["is an Optimizer"]
        assert facts["same"] and facts["fresh differs"]  # the state mattered, and came back
        assert facts["state tensors"] > 0
        assert f"rank {1 - rank}'s shard" in facts["other rank's shard"]
