"""tinyscale.core.device: one device picker for one process and for every rank of a job."""

import pytest
import torch

from tinyscale.core.device import DEVICES, select_device
from tinyscale.core.errors import UsageError


def test_select_device_cpu_and_auto() -> None:
    assert select_device("cpu") == torch.device("cpu")
    assert select_device("auto").type in {"cpu", "cuda", "mps"}
    if not torch.cuda.is_available() and not torch.backends.mps.is_available():
        assert select_device("auto") == torch.device("cpu")
        assert select_device() == torch.device("cpu")


def test_select_device_unknown_name_lists_valid_names() -> None:
    with pytest.raises(UsageError) as info:
        select_device("gpu")
    message = str(info.value)
    assert "\n" not in message and "'gpu'" in message
    assert all(name in message for name in DEVICES)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_select_device_cuda_without_a_gpu() -> None:
    with pytest.raises(UsageError) as info:
        select_device("cuda")
    message = str(info.value)
    assert "\n" not in message and "not available" in message and "--device auto or cpu" in message


def test_each_rank_gets_its_own_gpu_or_the_shared_cpu() -> None:
    device = select_device("auto", local_rank=3)
    if torch.cuda.is_available():
        assert device == torch.device("cuda", 3 % torch.cuda.device_count())
    else:
        assert device == torch.device("cpu")  # never mps: gloo moves CPU tensors
    assert select_device("cpu", local_rank=1) == torch.device("cpu")


def test_mps_serves_one_process() -> None:
    with pytest.raises(UsageError, match="serves one process: use --device cpu"):
        select_device("mps", local_rank=0)
