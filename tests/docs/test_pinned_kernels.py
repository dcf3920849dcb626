"""The test run's environment: the pages' numbers are pinned to one kernel choice on x86
(see the Makefile), and every process collects full garbage rarely (tests/startup).

Run:  pytest tests/docs/test_pinned_kernels.py
"""

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="x86 only")

PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def test_every_process_a_test_starts_gets_the_pinned_kernels() -> None:
    for name, value in PINNED.items():
        assert os.environ.get(name) == value, f"{name} is not {value}: set it as the Makefile does"
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    # A CPU without AVX2 falls back to DEFAULT; with AVX2 or more it must be AVX2.
    assert out[-1] in {"AVX2", "DEFAULT"}, f"torch chose {out[-1]} kernels"


def test_the_pin_changes_nothing_on_an_avx2_machine() -> None:
    """The recorded numbers were made unpinned on an AVX2 machine: pinned must equal them."""
    code = (
        "import torch; torch.manual_seed(0); a = torch.randn(257, 513); b = torch.randn(513, 129);"
        "print(repr((a @ b).sum().item()), repr(torch.nn.functional.softmax(a, -1).sum(0)[:4].tolist()))"
    )

    def run(env: dict[str, str]) -> str:
        return subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout

    unpinned = {k: v for k, v in os.environ.items() if k not in PINNED}
    capability = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
        env=unpinned,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()[-1]
    if capability != "AVX2":
        pytest.skip(f"this CPU's own kernels are {capability}: nothing to compare with")
    assert run(unpinned) == run(dict(os.environ))


def test_every_process_a_test_starts_collects_full_garbage_rarely() -> None:
    """tests/startup/sitecustomize.py runs in the processes a test starts (PYTHONPATH)."""
    out = subprocess.run(
        [sys.executable, "-c", "import gc; print(*gc.get_threshold())"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert [int(x) for x in out] == [700, 10, 1000]
