# --8<-- [start:compat]
"""Whether a driver can run a torch wheel's CUDA, and whether the wheel has kernels for a GPU.

Try it:  python -c "from tinyscale.ops.gpu_compat import check_driver as c; print(c(driver='535.154.05', driver_cuda=(12, 2), torch_cuda='12.8'))"

The two rules of NVIDIA's CUDA Compatibility guide that decide whether torch can use a GPU,
as pure functions of version numbers and compute capabilities: no GPU or driver needed.
tinyscale.ops.gpu_probe reads those numbers from the machine and runs these checks.
"""

import dataclasses
import re
from collections.abc import Sequence


def parse_version(text: str) -> tuple[int, ...]:
    """'580.65.06' -> (580, 65, 6); '12.4' -> (12, 4)."""
    try:
        return tuple(int(part) for part in text.strip().split("."))
    except ValueError:
        raise ValueError(f"not a version number: {text!r}") from None


# The oldest driver of each CUDA major version that runs every minor version of it
# ("minor version compatibility", NVIDIA's CUDA Compatibility guide; Linux drivers).
MINOR_COMPAT_MIN_DRIVER = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580,)}


@dataclasses.dataclass(frozen=True)
class Check:
    ok: bool
    message: str


def check_driver(*, driver: str, driver_cuda: tuple[int, int], torch_cuda: str | None) -> Check:
    """Can this driver run the CUDA runtime that ships inside the torch wheel?"""
    if torch_cuda is None:
        return Check(False, "this torch is a CPU-only build: install a CUDA wheel (cu126, cu130)")
    need = parse_version(torch_cuda)[:2]
    have = f"driver {driver} supports CUDA {driver_cuda[0]}.{driver_cuda[1]}"
    if driver_cuda >= need:
        return Check(True, f"{have} >= torch's CUDA {torch_cuda}")
    floor = MINOR_COMPAT_MIN_DRIVER.get(need[0])
    if driver_cuda[0] == need[0] and floor and parse_version(driver) >= floor:
        return Check(
            True,
            f"{have} < torch's CUDA {torch_cuda}, same major version: runs by minor version "
            "compatibility (features that need a newer driver fail at run time)",
        )
    floor_text = ".".join(map(str, floor)) if floor else "the one your CUDA release notes name"
    return Check(
        False,
        f"{have} < torch's CUDA {torch_cuda}: update the driver to >= {floor_text}, "
        f"or install a torch wheel built for CUDA {driver_cuda[0]}.x or older",
    )


def check_kernels(capability: tuple[int, int], arch_list: Sequence[str]) -> Check:
    """Does the wheel hold machine code (or PTX to compile) for this GPU's architecture?

    Machine code for sm_XY runs on any GPU of the same major version X with minor >= Y;
    PTX (compute_XY) is compiled by the driver for any capability >= X.Y.
    """
    cc = f"sm_{capability[0]}{capability[1]}"
    binary, ptx = [], []
    for arch in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+)(\d)", arch)  # 'sm_90a' (arch-specific) is skipped
        if m is None:
            continue
        built = (int(m.group(2)), int(m.group(3)))
        if m.group(1) == "sm" and built[0] == capability[0] and built[1] <= capability[1]:
            binary.append((built, arch))
        elif m.group(1) == "compute" and built <= capability:
            ptx.append((built, arch))
    if binary:  # the closest one is what runs
        return Check(True, f"{cc}: this torch has kernels for it ({max(binary)[1]})")
    if ptx:
        return Check(True, f"{cc}: no machine code, but PTX {max(ptx)[1]} compiles for it")
    return Check(
        False,
        f"{cc}: this torch has no kernels for it (built for {' '.join(arch_list)}): install a "
        "torch build that lists it in torch.cuda.get_arch_list()",
    )


# --8<-- [end:compat]
