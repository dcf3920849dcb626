"""The test run's environment: the pages' numbers are pinned to one kernel choice on x86
and one thread per process (see the Makefile), and every process collects full garbage
rarely and imports torch._dynamo only when something compiles (tests/startup).

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


TRAIN = """
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
ddp = torch.nn.parallel.DistributedDataParallel(model)
optimizers = [torch.optim.AdamW(model[0].parameters(), lr=1e-2),
              torch.optim.SGD(model[2].parameters(), lr=1e-2, momentum=0.9)]
for step in range(3):
    ddp(torch.randn(4, 8)).square().mean().backward()
    for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad()
optimizers[0].load_state_dict(optimizers[0].state_dict())
print([repr(p.sum().item()) for p in model.parameters()])
print("torch._dynamo" in sys.modules)
"""


def test_training_without_compiling_defers_dynamo_and_changes_no_number() -> None:
    plain = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ours, theirs = child(TRAIN).splitlines(), child(TRAIN, plain).splitlines()
    assert ours[0] == theirs[0], "the same weights, bit for bit"
    assert (ours[1], theirs[1]) == ("False", "True"), "torch alone imports dynamo; ours not yet"


def test_torchs_own_path_once_dynamo_is_imported() -> None:
    """Once torch._dynamo exists, a step breaks the graph, a marked method is wrapped in
    dynamo.disable, and DDP asks dynamo for its mode, as in plain torch."""
    code = """
import torch, torch._dynamo, torch.distributed as dist
breaks, asked = [], []
graph_break = torch._dynamo.graph_break
torch._dynamo.graph_break = lambda: breaks.append(1) or graph_break()
ddp_mode = torch._dynamo.utils.get_optimize_ddp_mode
torch._dynamo.utils.get_optimize_ddp_mode = lambda: asked.append(1) or ddp_mode()
layer = torch.nn.Linear(2, 2)
optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
layer(torch.ones(1, 2)).sum().backward()
optimizer.step()
optimizer.zero_grad()
zero_grad = torch.optim.Optimizer.zero_grad.__wrapped__
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
torch.nn.parallel.DistributedDataParallel(layer)
print(len(breaks), getattr(zero_grad, "__dynamo_disable", None) is not None, len(asked))
"""
    assert child(code).split() == ["2", "True", "1"]
