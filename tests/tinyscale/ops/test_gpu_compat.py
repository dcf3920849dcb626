"""tinyscale.ops.gpu_compat: the driver and kernel compatibility rules, and the version
numbers they compare, on the strings torch and the driver report.
"""

import pytest

from tinyscale.ops.gpu_compat import check_driver, check_kernels, parse_version

ARCHES = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]  # torch 2.14.1+cu130


def test_parse_version() -> None:
    assert parse_version("580.65.06") == (580, 65, 6)
    assert parse_version("12.4") == (12, 4)
    with pytest.raises(ValueError, match="not a version"):
        parse_version("12.x")


@pytest.mark.parametrize(
    ("driver", "driver_cuda", "torch_cuda", "ok", "says"),
    [
        ("580.65.06", (13, 0), "13.0", True, ">= torch's CUDA 13.0"),
        ("580.65.06", (13, 0), "12.8", True, ">= torch's CUDA 12.8"),  # older runtime: fine
        ("580.65.06", (13, 0), "13.1", True, "minor version compatibility"),
        ("550.54.15", (12, 4), "12.8", True, "minor version compatibility"),
        ("550.54.15", (12, 4), "13.0", False, "update the driver to >= 580"),
        ("470.82.01", (11, 4), "12.6", False, "update the driver to >= 525.60.13"),
        ("550.54.15", (12, 4), None, False, "CPU-only build"),
    ],
)
def test_check_driver(
    driver: str, driver_cuda: tuple[int, int], torch_cuda: str | None, ok: bool, says: str
) -> None:
    check = check_driver(driver=driver, driver_cuda=driver_cuda, torch_cuda=torch_cuda)
    assert check.ok is ok and says in check.message


@pytest.mark.parametrize(
    ("capability", "arches", "ok", "says"),
    [
        ((9, 0), ARCHES, True, "(sm_90)"),
        ((8, 9), ARCHES, True, "(sm_86)"),  # same major, newer minor: sm_86 code runs
        ((10, 3), ARCHES, True, "(sm_100)"),
        ((6, 1), ARCHES, False, "no kernels for it"),  # a Pascal GPU: dropped by CUDA 13
        ((9, 0), ["sm_80", "sm_90a"], False, "no kernels"),  # arch-specific code is not portable
        ((9, 0), ["sm_80", "compute_80"], True, "PTX compute_80"),
    ],
)
def test_check_kernels(capability: tuple[int, int], arches: list[str], ok: bool, says: str) -> None:
    check = check_kernels(capability, arches)
    assert check.ok is ok and says in check.message
