"""tinyscale.core.parity: flat_parameters lays out every parameter (or gradient) in
``parameters()`` order as a detached copy, largest_difference is max |a - b| over tensors or
two models, and bad input (no parameters, a missing gradient, shapes that differ) is one line.
"""

import copy

import pytest
import torch
from torch import nn

from tinyscale.core.errors import UsageError
from tinyscale.core.parity import flat_parameters, largest_difference


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def test_flat_parameters_is_every_parameter_in_order_as_a_copy() -> None:
    model = mlp()
    flat = flat_parameters(model)
    assert torch.equal(flat, nn.utils.parameters_to_vector(model.parameters()))
    assert not flat.requires_grad
    flat.zero_()  # a copy: the model keeps its weights
    assert model[0].weight.abs().sum() > 0
    mine = flat_parameters(p for p in model.parameters() if p.dim() == 1)  # any tensors given
    assert torch.equal(mine, torch.cat([model[0].bias, model[2].bias]).detach())


def test_flat_parameters_takes_the_gradients_with_grads_true() -> None:
    model = mlp()
    model(torch.ones(5, 3)).sum().backward()
    grads = flat_parameters(model, grads=True)
    assert torch.equal(grads, torch.cat([p.grad.flatten() for p in model.parameters()]))


def test_largest_difference_of_tensors_and_of_models() -> None:
    a, b = torch.tensor([[1.0, -2.0], [3.0, 4.0]]), torch.tensor([[1.0, 2.0], [3.5, 4.0]])
    assert largest_difference(a, b) == 4.0
    assert isinstance(largest_difference(a, b), float)
    model = mlp()
    assert largest_difference(model, copy.deepcopy(model)) == 0.0
    other = copy.deepcopy(model)
    with torch.no_grad():
        other[2].bias[1] += 0.5
    assert largest_difference(model, other) == pytest.approx(0.5)
    assert largest_difference(flat_parameters(model), other) == pytest.approx(0.5)


def test_bad_input_is_one_line() -> None:
    with pytest.raises(UsageError, match="no parameters given"):
        flat_parameters([])
    with pytest.raises(UsageError, match="call backward first"):
        flat_parameters(mlp(), grads=True)
    with pytest.raises(UsageError, match=r"shapes \(3,\) and \(1, 3\) differ"):
        largest_difference(torch.zeros(3), torch.zeros(1, 3))
    with pytest.raises(UsageError, match="same parameters"):
        largest_difference(mlp(), nn.Linear(3, 4))
