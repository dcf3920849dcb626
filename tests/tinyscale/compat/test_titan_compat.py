"""tinyscale.compat.titan_compat: each CPU patch is needed, correct, and off when CUDA is present.

The checks run in fresh Python processes: the patches change torchtitan's and torch's
modules for the whole process, and "unpatched" must mean never patched.
"""

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is in the cluster extra: make setup")


def run_in_fresh_pythons(scripts: dict[str, str]) -> dict[str, dict]:
    """Run each script in its own Python process, all at once; each prints one JSON line."""
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, code in scripts.items()
    }
    facts = {}
    try:
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"{name}: {stderr[-3000:]}"
            facts[name] = json.loads(stdout.strip().splitlines()[-1])
    finally:
        for proc in procs.values():
            proc.kill()  # only ever our own children; a no-op for those that exited
    return facts


PATCHED = """
import json
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torchtitan.tools.utils as utils
out = {"unpatched_device": utils.device_type}

q, k, v = (torch.randn(1, 2, 16, 8, requires_grad=True) for _ in range(3))
try:
    flex_attention(q, k, v)
    out["unpatched_flex"] = "ran"
except NotImplementedError as err:
    out["unpatched_flex"] = str(err)

from tinyscale.compat import titan_compat
out["patches"] = titan_compat.apply()
out["device"] = utils.device_type
out["current_device"] = utils.device_module.current_device()
out["ram"] = utils.device_module.get_device_properties().total_memory
out["peak"] = utils.device_module.memory_stats()["active_bytes.all.peak"]

causal = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, 16, 16, device="cpu")
flex_attention(q, k, v, block_mask=causal).sum().backward()
flex_grads = [t.grad.clone() for t in (q, k, v)]
for t in (q, k, v):
    t.grad = None
F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
out["grad_diff"] = max((a - t.grad).abs().max().item() for a, t in zip(flex_grads, (q, k, v)))

import torchtitan.trainer  # noqa: F401
try:
    titan_compat.apply()
    out["late"] = "applied"
except RuntimeError as err:
    out["late"] = str(err)
print(json.dumps(out))
"""

CUDA_PRESENT = """
import json
import torch
torch.cuda.is_available = lambda: True  # as on a GPU node
from tinyscale.compat import titan_compat
import torchtitan.tools.utils as utils
print(json.dumps({"patches": titan_compat.apply(), "device": utils.device_type}))
"""


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    """Both checks at once: on 2 cores the two processes overlap."""
    return run_in_fresh_pythons({"patched": PATCHED, "cuda_present": CUDA_PRESENT})


def test_each_patch_is_needed_and_the_flex_backward_is_right(runs: dict[str, dict]) -> None:
    facts = runs["patched"]
    assert facts["unpatched_device"] == "cuda", "torchtitan assumes CUDA: the patch is needed"
    assert "does not support backward on CPU" in facts["unpatched_flex"]
    assert facts["patches"] == [
        "device type: cpu",
        "flex_attention: backward on CPU",
        "flex_attention and block masks: eager",
        "FSDP reduce-scatter: SUM instead of PREMUL_SUM",
    ]
    assert facts["device"] == "cpu" and facts["current_device"] == 0
    assert facts["ram"] > 2**30 and facts["peak"] > 2**20
    assert facts["grad_diff"] < 1e-5, "eager flex attention's backward = SDPA's"
    assert "must run before torchtitan.trainer is imported" in facts["late"]


def test_nothing_is_patched_when_cuda_is_present(runs: dict[str, dict]) -> None:
    facts = runs["cuda_present"]
    assert facts == {"patches": [], "device": "cuda"}
