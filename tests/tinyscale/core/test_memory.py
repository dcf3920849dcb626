"""tinyscale.core.memory: the bytes-per-parameter formula (4 + 4 + 8 for fp32 AdamW) measured on a
real model after a real optimizer step, activation memory linear in the batch size, and the
human-readable byte formatting.
"""

import pytest
import torch

from tinyscale.core.config import preset
from tinyscale.core.memory import (
    RECIPES,
    StateBytes,
    activation_bytes,
    human_bytes,
    measured_state_bytes,
    model_state_bytes,
)
from tinyscale.core.model import TinyTransformer
from tinyscale.core.precision import PRECISIONS

CFG = preset("tiny", dropout=0.1)  # with dropout: its masks are saved activations too


def test_measured_state_bytes_equal_the_fp32_formula() -> None:
    torch.manual_seed(0)
    model = TinyTransformer(CFG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = measured_state_bytes(model, optimizer)
    assert before.grads == 0 and before.optimizer == 0  # nothing allocated before a step
    x = torch.randint(0, CFG.vocab_size, (4, CFG.max_position_embeddings))
    _, loss = model(x, x)
    assert loss is not None
    loss.backward()
    optimizer.step()
    measured = measured_state_bytes(model, optimizer)
    paper = model_state_bytes(model.num_parameters(), "fp32")
    assert measured == paper
    assert (measured.params, measured.grads, measured.optimizer) == tuple(
        b * model.num_parameters() for b in (4, 4, 8)
    )
    assert measured.total == 16 * model.num_parameters()


def test_model_state_bytes_recipes() -> None:
    assert RECIPES["fp32"] == (4, 4, 8) and sum(RECIPES["bf16"]) == 16
    assert set(RECIPES) == set(PRECISIONS)  # one vocabulary for runs and formulas
    assert model_state_bytes(1000, "bf16") == StateBytes(2000, 2000, 12000)
    assert model_state_bytes(7e9).total == 16 * 7 * 10**9
    assert str(model_state_bytes(1024, "fp32")) == (
        "weights 4.0 KiB + gradients 4.0 KiB + optimizer 8.0 KiB = 16.0 KiB"
    )


def test_activation_bytes_linear_in_batch_size() -> None:
    torch.manual_seed(0)
    model = TinyTransformer(CFG).train()
    T = CFG.max_position_embeddings
    measured = {}
    for batch in (4, 8, 16):
        x = torch.randint(0, CFG.vocab_size, (batch, T))
        measured[batch] = activation_bytes(model, x, x)
    assert measured[4] > 0
    assert measured[8] / measured[4] == pytest.approx(2, rel=0.01)
    assert measured[16] / measured[8] == pytest.approx(2, rel=0.01)
    # and it grows with the sequence length
    short = activation_bytes(model, torch.zeros(8, T // 2, dtype=torch.long))
    assert short < measured[8]


def test_activation_bytes_are_released_and_not_parameters() -> None:
    torch.manual_seed(0)
    model = TinyTransformer(CFG).eval()
    with torch.no_grad():
        x = torch.randint(0, CFG.vocab_size, (2, 8))
        assert activation_bytes(model, x) == 0  # no graph, nothing saved for backward
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    tiny = activation_bytes(model, torch.zeros(1, 1, dtype=torch.long))
    assert 0 < tiny < param_bytes


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1,023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (5 * 1024**2, "5.0 MiB"),
        (1024**3, "1.0 GiB"),
        (3 * 1024**4, "3,072.0 GiB"),
        (-2048, "-2.0 KiB"),
    ],
)
def test_human_bytes(n: int, text: str) -> None:
    assert human_bytes(n) == text
