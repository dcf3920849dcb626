"""tinyscale.ops.large_batch: the scaling rules, the noise-scale estimator on gradients with a
known answer, and one short real run that proves the recipes train on the same samples."""

import math

import pytest
import torch

from tinyscale.core.config import ModelConfig
from tinyscale.core.data import build_datasets
from tinyscale.core.errors import UsageError, run_cli
from tinyscale.core.model import TinyTransformer
from tinyscale.ops.large_batch import (
    Recipe,
    linear_lr,
    main,
    mean_sq_grad_norm,
    noise_scale,
    recipes,
    sqrt_lr,
    train_recipe,
)


def test_linear_and_sqrt_rules() -> None:
    assert linear_lr(base_lr=1e-3, base_batch=8, batch=32) == pytest.approx(4e-3)
    assert sqrt_lr(base_lr=1e-3, base_batch=8, batch=32) == pytest.approx(2e-3)
    assert sqrt_lr(base_lr=1e-3, base_batch=8, batch=8) == pytest.approx(1e-3)
    # two doublings in a row are one quadrupling, for both rules
    twice = sqrt_lr(base_lr=sqrt_lr(base_lr=1.0, base_batch=1, batch=2), base_batch=2, batch=4)
    assert twice == pytest.approx(sqrt_lr(base_lr=1.0, base_batch=1, batch=4))


def test_recipes_keep_the_samples_and_vary_only_lr_and_warmup() -> None:
    rs = recipes(base_batch=8, base_lr=1e-3, k=4)
    assert [r.batch_size for r in rs] == [8, 32, 32, 32, 32]
    assert [r.lr for r in rs] == pytest.approx([1e-3, 1e-3, 4e-3, 4e-3, 2e-3])
    assert [r.warmup_fraction for r in rs] == [0.2, 0.2, 0, 0.2, 0.2]


def test_noise_scale_recovers_trace_over_norm_from_synthetic_gradients() -> None:
    """Per-sample gradients G + noise with covariance σ²·I in d dimensions: tr(Σ) = dσ².
    The mean squared norm of B-sample averages, fed to the estimator, gives dσ² / |G|²."""
    gen = torch.Generator().manual_seed(0)
    d, sigma = 50, 2.0
    true_grad = torch.full((d,), 0.5)  # |G|² = 12.5
    expected = d * sigma**2 / true_grad.pow(2).sum().item()  # 16 samples

    def mean_sq(batch: int, draws: int = 4000) -> float:
        noise = torch.randn(draws, batch, d, generator=gen) * sigma
        return (true_grad + noise.mean(dim=1)).pow(2).sum(dim=1).mean().item()

    got = noise_scale(small=4, sq_norm_small=mean_sq(4), big=64, sq_norm_big=mean_sq(64))
    assert got == pytest.approx(expected, rel=0.1)


def test_noise_scale_is_exact_on_the_expectation() -> None:
    g2, tr = 3.0, 48.0
    assert noise_scale(small=2, sq_norm_small=g2 + tr / 2, big=16, sq_norm_big=g2 + tr / 16) == (
        pytest.approx(16.0)
    )


@pytest.fixture(scope="module")
def data():
    return build_datasets(vocab_size=1024, block_size=64)


def test_bigger_batches_have_smaller_gradient_noise(data) -> None:
    """E|g_B|² falls with B (the noise term tr(Σ)/B), which is what the estimator needs."""
    torch.manual_seed(0)
    model = TinyTransformer(ModelConfig())
    small = mean_sq_grad_norm(model, data, batch=2, draws=4)
    big = mean_sq_grad_norm(model, data, batch=32, draws=4)
    assert small > big > 0


def test_a_recipe_trains_on_exactly_its_samples(data) -> None:
    r = train_recipe(Recipe(name="t", batch_size=8, lr=3e-3, warmup_fraction=0.2), data, samples=48)
    assert r["steps"] == 6
    assert r["heldout_loss"] < math.log(1024)  # 6 steps already beat the uniform guess


def test_bad_input(data, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError, match="raise --samples"):
        train_recipe(Recipe(name="t", batch_size=32, lr=1e-3, warmup_fraction=0), data, samples=40)
    with pytest.raises(UsageError, match="small < big"):
        noise_scale(small=8, sq_norm_small=1.0, big=8, sq_norm_big=1.0)
    assert run_cli(main, ["--k", "1"]) == 2
    assert "need --base-batch >= 1, --k >= 2" in capsys.readouterr().err
