"""tinyscale.core.device as on an Apple-silicon Mac: MPS available, no CUDA.

select_device's MPS rules only show where MPS is available, which this machine is not:
these tests make torch say it is (and that there is no CUDA), as on a Mac. One process
gets mps; a rank of several never does, since gloo moves CPU tensors (docs/start/mac.md).
"""

import pytest
import torch

from tinyscale.core.device import select_device
from tinyscale.core.errors import UsageError


@pytest.fixture
def a_mac(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_one_process_gets_the_gpu(a_mac: None) -> None:
    assert select_device() == torch.device("mps")
    assert select_device("mps") == torch.device("mps")
    assert select_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("local_rank", [0, 1, 3])
def test_a_rank_gets_the_cpu_never_mps(a_mac: None, local_rank: int) -> None:
    assert select_device("auto", local_rank=local_rank) == torch.device("cpu")
    assert select_device("cpu", local_rank=local_rank) == torch.device("cpu")
    with pytest.raises(UsageError, match=r"^device 'mps' serves one process: use --device cpu"):
        select_device("mps", local_rank=local_rank)


def test_cuda_on_a_mac_names_the_way_out(a_mac: None) -> None:
    with pytest.raises(UsageError, match=r"device 'cuda' is not available .* --device auto or cpu"):
        select_device("cuda")
