"""tinyscale.core.training: device choice, the learning-rate schedule, TrainConfig checks, the
per-epoch shuffle, evaluation, and the AdamW parameter groups.
"""

import itertools
import math
from pathlib import Path

import pytest
import torch

from helpers import one_line_error
from tinyscale.core.config import preset
from tinyscale.core.data import TokenBlocks, epoch_batches, get_batch
from tinyscale.core.errors import UsageError
from tinyscale.core.model import TinyTransformer
from tinyscale.core.training import TrainConfig, evaluate, lr_at, make_optimizer, plan_steps

CFG = preset("micro", num_hidden_layers=2)


def test_lr_warmup_then_cosine_decay() -> None:
    cfg = TrainConfig(lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    total = 100
    lrs = [lr_at(step, cfg, total) for step in range(total + 1)]
    # warmup: a straight line from lr/warmup up to lr
    warm = lrs[: cfg.warmup_steps]
    assert warm[0] == pytest.approx(cfg.lr / cfg.warmup_steps)
    assert warm[-1] == pytest.approx(cfg.lr)
    steps = [b - a for a, b in itertools.pairwise(warm)]
    assert all(s == pytest.approx(cfg.lr / cfg.warmup_steps) for s in steps)
    # then it never rises, starts at lr, and ends at lr * min_lr_ratio
    decay = lrs[cfg.warmup_steps :]
    assert decay[0] == pytest.approx(cfg.lr)
    assert all(b <= a for a, b in itertools.pairwise(decay))
    assert decay[1] < decay[0]
    assert lrs[total] == pytest.approx(cfg.lr * cfg.min_lr_ratio)
    # half way through the decay the cosine is at its middle
    mid = cfg.warmup_steps + (total - cfg.warmup_steps) // 2
    assert lrs[mid] == pytest.approx(cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) / 2))
    assert max(lrs) == pytest.approx(cfg.lr) and min(lrs) >= cfg.lr * cfg.min_lr_ratio - 1e-15


def test_lr_without_warmup_starts_at_peak() -> None:
    cfg = TrainConfig(lr=0.5, warmup_steps=0, min_lr_ratio=0.0)
    assert lr_at(0, cfg, 10) == pytest.approx(0.5)
    assert lr_at(10, cfg, 10) == pytest.approx(0.0)


@pytest.mark.parametrize(
    ("field", "flag"),
    [
        ("epochs", "--epochs"),
        ("global_batch_size", "--global-batch-size"),
        ("eval_every", "--eval-every"),
        ("checkpoint_every", "--checkpoint-every"),
        ("max_steps", "--max-steps"),
        ("lr", "--lr"),
    ],
)
@pytest.mark.parametrize("value", [0, -1])
def test_train_config_rejects_non_positive(field: str, flag: str, value: int) -> None:
    with pytest.raises(UsageError) as info:
        TrainConfig(**{field: value})
    message = str(info.value)
    assert "\n" not in message and flag in message and "positive" in message


@pytest.mark.parametrize("lr", [math.nan, math.inf])
def test_train_config_rejects_non_finite_lr(lr: float) -> None:
    with pytest.raises(UsageError, match="--lr"):
        TrainConfig(lr=lr)


@pytest.mark.parametrize(
    "kwargs",
    [{"warmup_steps": -1}, {"grad_clip": 0.0}, {"min_lr_ratio": 1.5}, {"min_lr_ratio": -0.1}],
)
def test_train_config_rejects_bad_schedule(kwargs: dict[str, float]) -> None:
    with pytest.raises(UsageError):
        TrainConfig(**kwargs)


def test_a_file_where_a_directory_goes_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "runs").write_text("not a directory")
    for field, flag in (("output_dir", "--output-dir"), ("log_dir", "--log-dir")):
        with pytest.raises(UsageError) as info:
            TrainConfig(**{field: str(tmp_path / "runs")})
        message = str(info.value)
        assert "\n" not in message and message.startswith(f"{flag} ") and "is a file" in message


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [({"precision": "fp8"}, "unknown precision 'fp8'"), ({"device": "gpu"}, "unknown device")],
)
def test_train_config_names_the_choices(kwargs: dict[str, str], words: str) -> None:
    with pytest.raises(UsageError, match=words):
        TrainConfig(**kwargs)


def test_the_step_plan_of_a_run_stopped_early() -> None:
    plan = plan_steps(30, TrainConfig(epochs=2, max_steps=45), samples=480)
    assert (plan.steps_per_epoch, plan.total_steps, plan.stop_at) == (30, 60, 45)
    assert plan.position(0) == (0, 0) and plan.position(31) == (1, 1)
    assert plan_steps(30, TrainConfig(epochs=2), samples=480).stop_at == 60
    with pytest.raises(UsageError, match="no full step in an epoch of 8 training samples"):
        plan_steps(0, TrainConfig(global_batch_size=16), samples=8)


def test_the_plans_batches_go_on_where_a_resume_left_off() -> None:
    """Every step's (epoch, batch) once, in order, from any step to stop_at: a run resumed
    at step k sees exactly the batches the uninterrupted run saw after step k."""
    plan = plan_steps(3, TrainConfig(epochs=3, max_steps=7), samples=48)

    def order(epoch: int) -> list[str]:
        return [f"e{epoch}b{b}" for b in range(3)]

    whole = list(plan.batches(0, order))
    assert whole == [(e, f"e{e}b{b}") for e in range(3) for b in range(3)][:7]
    for k in range(8):
        assert list(plan.batches(k, order)) == whole[k:]


def test_a_resumed_run_needs_steps_left_and_the_line_names_the_flag_that_ends_it() -> None:
    plan_steps(30, TrainConfig(epochs=2), samples=480).check_steps_left(59)
    at_end = one_line_error(plan_steps(30, TrainConfig(epochs=2), samples=480).check_steps_left, 60)
    assert (
        at_end
        == "the checkpoint is at step 60, the end of this run: raise --epochs to train further"
    )
    early = plan_steps(30, TrainConfig(epochs=2, max_steps=45), samples=480)
    assert one_line_error(early.check_steps_left, 50).endswith("raise --max-steps to train further")


def test_train_config_defaults_are_valid() -> None:
    cfg = TrainConfig()
    assert cfg.epochs > 0 and cfg.max_steps is None
    TrainConfig(max_steps=1, epochs=1, global_batch_size=1, eval_every=1, checkpoint_every=1)


def test_epoch_batches_deterministic_and_fresh_each_epoch() -> None:
    a = epoch_batches(103, 10, seed=0, epoch=0)
    b = epoch_batches(103, 10, seed=0, epoch=0)
    assert [t.tolist() for t in a] == [t.tolist() for t in b]
    c = epoch_batches(103, 10, seed=0, epoch=1)
    assert [t.tolist() for t in a] != [t.tolist() for t in c]
    d = epoch_batches(103, 10, seed=5, epoch=0)
    assert [t.tolist() for t in a] != [t.tolist() for t in d]


@pytest.mark.parametrize(
    ("n", "batch"),
    [
        (103, 10),
        (100, 10),
        (7, 3),
        (5, 5),
        (4, 5),
        (0, 5),
    ],
)
def test_epoch_batches_are_disjoint_full_batches(n: int, batch: int) -> None:
    batches = epoch_batches(n, batch, seed=1, epoch=2)
    assert len(batches) == n // batch
    assert all(len(b) == batch for b in batches)
    flat = torch.cat(batches).tolist() if batches else []
    assert len(flat) == len(set(flat)) == n - n % batch  # each index at most once
    assert set(flat) <= set(range(n))


def make_blocks(num_blocks: int = 11) -> TokenBlocks:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, CFG.vocab_size, (num_blocks * 8 + 1,), generator=generator)
    return TokenBlocks(tokens, CFG.max_position_embeddings)


@pytest.mark.parametrize("training", [True, False])
def test_evaluate_perplexity_and_training_flag(training: bool) -> None:
    torch.manual_seed(0)
    model = TinyTransformer(CFG).train(training)
    blocks = make_blocks()
    metrics = evaluate(model, blocks, batch_size=4, device=torch.device("cpu"))
    assert model.training is training
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["loss"]), rel=1e-12)
    # the mean over all blocks, whatever the batch size (11 blocks: batches of 4, 4, 3)
    model.eval()
    with torch.no_grad():
        x, y = get_batch(blocks, torch.arange(len(blocks)), torch.device("cpu"))
        _, loss = model(x, y)
    assert loss is not None
    assert metrics["loss"] == pytest.approx(loss.item(), rel=1e-5)
    again = evaluate(model, blocks, batch_size=11, device=torch.device("cpu"))
    assert again["loss"] == pytest.approx(metrics["loss"], rel=1e-5)  # dropout was off


def test_get_batch_stacks_blocks() -> None:
    blocks = make_blocks()
    x, y = get_batch(blocks, torch.tensor([3, 0]), torch.device("cpu"))
    assert x.shape == y.shape == (2, 8)
    assert torch.equal(x[0], blocks[3][0]) and torch.equal(y[1], blocks[0][1])


def test_make_optimizer_groups() -> None:
    model = TinyTransformer(CFG)
    optimizer = make_optimizer(model, TrainConfig(weight_decay=0.25, lr=0.01))
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.25 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"])
    assert all(p.dim() < 2 for p in no_decay["params"])
    grouped = [id(p) for group in optimizer.param_groups for p in group["params"]]
    assert len(grouped) == len(set(grouped))  # no parameter twice (the tied matrix included)
    assert set(grouped) == {id(p) for p in model.parameters()}  # and none left out
    names = {id(p): n for n, p in model.named_parameters()}
    assert "tok_emb.weight" in {names[id(p)] for p in decay["params"]}
    assert "ln_f.weight" in {names[id(p)] for p in no_decay["params"]}
    assert all(group["lr"] == 0.01 for group in optimizer.param_groups)
