# --8<-- [start:header]
"""Make torchtitan 0.3.0 train on CPU processes over gloo: a few patches, each named.

    torchrun --nproc-per-node 2 code/scripts/torchtitan_train.py \\
        --module tinyscale.compat.titan_config --config tinyscale_debug

torchtitan is GPU-first. Its code picks the accelerator once, at import, and assumes
CUDA when it finds none; it asks the device module for memory statistics that only
CUDA has. `apply()` patches exactly those places, and only when no GPU is present: on
a CUDA machine it changes nothing, and the same command runs torchtitan unpatched.
Each patch says what upstream limitation it works around and how to tell that it is
no longer needed.
"""

import os
import platform
import resource
import sys
import types

import torch

PATCHES: list[str] = []  # the names of the patches applied in this process, in order

# --8<-- [end:header]


# --8<-- [start:device]
def cpu_device_module() -> types.ModuleType:
    """torch.cpu plus the memory calls torchtitan's DeviceMemoryMonitor makes, and an
    integer current_device for its barrier.

    Limitation: torchtitan.components.metrics asks the device module for
    get_device_name, get_device_properties(...).total_memory, memory_stats,
    reset_peak_memory_stats and empty_cache; torch.cpu has none of them. On CPU the
    honest numbers are the machine's RAM and the process's peak resident set size
    (getrusage), which cannot be reset: "peak" means since the process started.
    """
    module = types.ModuleType("tinyscale_cpu_device")
    module.__dict__.update({k: v for k, v in vars(torch.cpu).items() if not k.startswith("__")})
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    name = platform.processor() or platform.machine() or "CPU"

    def peak_rss_bytes() -> int:
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        return kib * (1 if sys.platform == "darwin" else 1024)  # bytes on macOS

    module.get_device_name = lambda device=None: f"CPU ({name})"
    module.get_device_properties = lambda device=None: types.SimpleNamespace(
        name=f"CPU ({name})", total_memory=total
    )
    module.memory_stats = lambda device=None: {
        "active_bytes.all.peak": peak_rss_bytes(),
        "reserved_bytes.all.peak": peak_rss_bytes(),
        "num_alloc_retries": 0,
        "num_ooms": 0,
    }
    module.reset_peak_memory_stats = lambda device=None: None
    module.empty_cache = lambda: None
    # torch.cpu.current_device() is the string "cpu"; torchtitan passes it to
    # barrier(device_ids=[...]), which takes integers
    module.current_device = lambda: 0
    return module


def patch_device_detection() -> None:
    """Limitation: torchtitan.tools.utils sets ``device_type = _get_available_device_type()
    or "cuda"`` at import, so on a machine without an accelerator every module that
    imports it (trainer, parallel_dims, distributed.utils, metrics, token_dispatcher)
    calls torch.cuda and fails with "Found no NVIDIA driver". Set it to "cpu" before
    those modules are imported. Not needed once torchtitan falls back to "cpu".
    """
    import torchtitan.tools.utils as utils

    utils.device_type, utils.device_module = "cpu", cpu_device_module()
    PATCHES.append("device type: cpu")


# --8<-- [end:device]


# --8<-- [start:flex]
def patch_flex_attention_backward() -> None:
    """Limitation: torch 2.14's flex_attention refuses inputs that require grad on CPU
    (``_validate_device``: "FlexAttention does not support backward on CPU"), and
    torchtitan always trains through flex_attention (its language models no longer
    accept sdpa). The eager implementation is plain differentiable tensor code, so
    backward is correct; only the guard is in the way. Keep the guard for every other
    case. Not needed once torch supports flex backward on CPU.
    """
    import torch.nn.attention.flex_attention as flex

    original = flex._validate_device

    def validate_device(query, key, value) -> None:
        if query.device.type == "cpu":
            return  # eager on CPU: differentiable math, no kernel needed
        original(query, key, value)

    flex._validate_device = validate_device
    PATCHES.append("flex_attention: backward on CPU")


def patch_flex_attention_eager() -> None:
    """Limitation: torchtitan wraps flex_attention and create_block_mask in torch.compile
    at import (models/common/attention.py); on CPU that JIT-compiles C++ kernels with
    inductor for every new shape (tens of seconds here), and the compiled CPU kernel has
    no backward. Run both eagerly. Not needed on GPUs, where the compiled kernel is the
    point.
    """
    import torchtitan.models.common.attention as attention
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    attention.FlexAttention._compiled_flex_attn = flex_attention
    attention._compiled_create_block_mask = create_block_mask
    PATCHES.append("flex_attention and block masks: eager")


# --8<-- [end:flex]


# --8<-- [start:premul]
def patch_premul_sum_on_gloo() -> None:
    """Limitation: torchtitan scales gradients itself (by the global token count) and so
    sets FSDP's gradient divide factor to 1.0; FSDP2 then reduce-scatters with
    ReduceOp.PREMUL_SUM, which NCCL has and gloo has not ("Cannot use ReduceOp.PREMUL_SUM
    with Gloo"). FSDP2's own switch, set_force_sum_reduction_for_comms(True), makes it
    send a plain SUM and scale separately. Not needed on NCCL.
    """
    import torchtitan.distributed.fsdp as titan_fsdp
    from torch.distributed.fsdp import FSDPModule

    original = titan_fsdp.disable_fsdp_gradient_division

    def disable_division_then_force_sum(model) -> None:
        original(model)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)

    titan_fsdp.disable_fsdp_gradient_division = disable_division_then_force_sum
    PATCHES.append("FSDP reduce-scatter: SUM instead of PREMUL_SUM")


# --8<-- [end:premul]


# --8<-- [start:apply]
def needs_patches() -> bool:
    return not torch.cuda.is_available()


def apply() -> list[str]:
    """Patch torchtitan for CPU if there is no GPU; before importing torchtitan.train."""
    if "torchtitan.trainer" in sys.modules:
        raise RuntimeError(
            "tinyscale.compat.titan_compat.apply() must run before torchtitan.trainer is imported: "
            "call it first in the launch script"
        )
    # Nothing is downloaded at run time: our tokenizer and corpus are local files.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if needs_patches():
        patch_device_detection()
        patch_flex_attention_backward()
        patch_flex_attention_eager()
        patch_premul_sum_on_gloo()
    return PATCHES


# --8<-- [end:apply]
