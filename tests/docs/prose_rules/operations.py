"""Numbers in the prose of docs/operations/ that pass by rule, not by data.

Read by tools/prose_numbers.py; the format and the rules are in tests/docs/prose_rules/README.md.
"""

PROSE_RULES: dict[str, list[tuple[str, str]]] = {
    "operations/gpu-stack.md": [
        ('"CUDA Version: 12.4" in `nvidia-smi` is not an installed CUDA', "example"),
        (
            "The driver each CUDA release was shipped with (NVIDIA's CUDA release notes, Linux x86_64). A driver this new or newer supports that CUDA directly: | CUDA | Driver shipped with it | Minimum for minor version compatibility | |---|---|---| | 12.4 | 550.54.14 | 525.60.13 (any 12.x) | | 12.6 | 560.28.03 | 525.60.13 | | 12.8 | 570.26 | 525.60.13 | | 12.9 | 575.51.03 |",
            "source",
        ),
        (
            "The compute capabilities of common GPUs, from NVIDIA's list of CUDA GPUs: | GPU | Compute capability | | GPU | Compute capability | |---|---|---|---|---| | V100 | 7.0 | | L4, L40S, RTX 4090 | 8.9 | | T4 | 7.5 | | H100, H200 | 9.0 | | A100 | 8.0 | | B200 | 10.0 | | A10, RTX 3090 | 8.6 |",
            "source",
        ),
        (
            "CUDA 13 dropped the GPUs before Turing (7.5), as CUDA 13.0's release notes say",
            "source",
        ),
        ("100 % does not mean every core is busy", "example"),
        ('A GPU at "100 %" utilization but far below its power limit', "example"),
        (
            "Docker gives a container 64 MiB of `/dev/shm` (its `docker run` reference, `--shm-size`)",
            "source",
        ),
        ("A node shows 100 % utilization but draws 120 W of its 700 W limit", "example"),
        ('all read as "100 %"', "example"),
    ],
    "operations/gpu-memory.md": [
        (
            "Frees unused cached blocks once reserved memory passes 80 % of the limit",
            "definition",
        ),
        ("Find the smallest capacity, in steps of 2 MiB", "example"),
        (
            "`nvidia-smi` shows 70 GiB used, `torch.cuda.memory_allocated()` says 40 GiB",
            "example",
        ),
    ],
    "operations/hangs.md": [
        ("so a wait ends after 2 seconds with an error instead of never", "definition"),
        ("a plain Python timer thread that calls it at 60 % of the timeout", "definition"),
        (
            "GPU utilisation at 0 % (or at 100 % on every GPU: NCCL kernels spin while they wait) with no progress means hung",
            "example",
        ),
        ("Here every collective takes milliseconds, so 2 seconds is plenty", "definition"),
    ],
    "operations/large-batch.md": [
        (
            "(McCandlish et al. 2018): below it, doubling the batch halves the steps needed (perfect scaling)",
            "source",
        ),
        ("Lab 1's gradient clipping at norm 1.0", "definition"),
        ("Start from a batch of 4 (lr 3e-3) and go to 32", "example"),
    ],
    "operations/nccl-network.md": [
        (
            "The orders of magnitude of these links, per GPU and direction, are in Session B's table (NVLink hundreds of GB/s, an InfiniBand NDR port about 50 GB/s); they come from vendor specifications (NVIDIA's NVLink and InfiniBand datasheets)",
            "source",
        ),
    ],
    "operations/storage.md": [
        ("saves a DCP checkpoint every 1000 steps for 100 000 steps", "example"),
    ],
}
