# --8<-- [start:device]
"""Which device a process computes on: one function for one process and for every rank.

Try it:  python -c "from tinyscale.core.device import select_device; print(select_device())"
"""

import torch

from tinyscale.core.errors import UsageError

DEVICES = ("auto", "cpu", "mps", "cuda")


def select_device(name: str = "auto", *, local_rank: int | None = None) -> torch.device:
    """cuda if there is a GPU, else mps on an Apple-silicon Mac, else cpu; or exactly what was asked.

    ``local_rank``: this process's place on its node, in a job of several processes. Each
    takes its own GPU, ``cuda:local_rank``; on CPUs they share the cores. MPS serves one
    process: gloo moves CPU tensors, not MPS ones.
    """
    if name not in DEVICES:
        raise UsageError(f"unknown device '{name}': use one of {', '.join(DEVICES)}")
    available = {
        "cpu": True,
        "cuda": torch.cuda.is_available(),
        "mps": torch.backends.mps.is_available() and local_rank is None,
    }
    if name == "auto":
        name = next(d for d in ("cuda", "mps", "cpu") if available[d])
    if name == "mps" and local_rank is not None:
        raise UsageError("device 'mps' serves one process: use --device cpu for several")
    if not available[name]:
        raise UsageError(
            f"device '{name}' is not available on this machine: use --device auto or cpu"
        )
    if name == "cuda" and local_rank is not None:  # one GPU per process, picked by LOCAL_RANK
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device(name)


# --8<-- [end:device]
