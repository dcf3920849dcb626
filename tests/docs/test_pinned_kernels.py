"""The test run's environment: the pages' numbers are pinned to one kernel choice on x86
and one thread per process (see the Makefile), and every process collects full garbage
rarely (tests/startup).

Run:  pytest tests/docs/test_pinned_kernels.py
"""

import os
import platform
import subprocess
import sys

import pytest

x86_only = pytest.mark.skipif(platform.machine() != "x86_64", reason="x86 only")

PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
CAPABILITY = "import torch; print(torch.backends.cpu.get_cpu_capability())"


def child(code: str, env: dict[str, str] | None = None) -> str:
    """What `python -c code` prints in a process started as a test starts one."""
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout


def test_every_process_a_test_starts_gets_one_thread_and_the_pinned_kernels() -> None:
    assert os.environ.get("OMP_NUM_THREADS") == "1", "set OMP_NUM_THREADS=1 as the Makefile does"
    chosen, threads = child(f"{CAPABILITY}; print(torch.get_num_threads())").split()[-2:]
    assert threads == "1", f"a child process computes with {threads} threads"
    if platform.machine() != "x86_64":
        return
    for name, value in PINNED.items():
        assert os.environ.get(name) == value, f"{name} is not {value}: set it as the Makefile does"
    # A CPU without AVX2 falls back to DEFAULT; with AVX2 or more it must be AVX2.
    assert chosen in {"AVX2", "DEFAULT"}, f"torch chose {chosen} kernels"


@x86_only
def test_the_pin_changes_nothing_on_an_avx2_machine() -> None:
    """The recorded numbers were made unpinned on an AVX2 machine: pinned must equal them."""
    code = (
        f"{CAPABILITY}; torch.manual_seed(0); a = torch.randn(257, 513); b = torch.randn(513, 129);"
        "print(repr((a @ b).sum().item()), repr(torch.nn.functional.softmax(a, -1).sum(0)[:4].tolist()))"
    )
    unpinned = {k: v for k, v in os.environ.items() if k not in PINNED}
    capability, *numbers = child(code, unpinned).splitlines()
    if capability != "AVX2":
        pytest.skip(f"this CPU's own kernels are {capability}: nothing to compare with")
    assert child(code, dict(os.environ)).splitlines() == ["AVX2", *numbers]


def test_every_process_a_test_starts_collects_full_garbage_rarely() -> None:
    """tests/startup/sitecustomize.py runs in the processes a test starts (PYTHONPATH):
    young and middle generations as Python sets them, full collections 100 times rarer."""
    thresholds = "import gc; print(*gc.get_threshold())"
    ours = [int(x) for x in child(thresholds).split()]
    plain = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    default = [int(x) for x in child(thresholds, plain).split()]
    assert ours == [default[0], default[1], 100 * default[2]]
