"""Run at the start of every Python process of the test run (`make test` puts this folder
on PYTHONPATH; the root conftest.py does it for a bare pytest). Three changes, all of the
time a process takes to start, none of any result. Readers' own runs have none.

1. Importing torch and torch._dynamo leaves about 320,000 objects that CPython's cyclic
garbage collector tracks. A full collection walks all of them, and by default one runs
each time the heap has grown by a quarter: during the import, many times over a growing
heap. Measured here: `import torch, torch._dynamo` and the course's training modules took
5.7 s of CPU with the default thresholds and 4.4 s with full collections made rarer.
Only *when* cyclic garbage is collected changes: young objects are collected as often as
before, no result depends on it, and most processes of the test run live for seconds.

2. torch imports torch._dynamo, the compiler's front end (about 1 s of CPU here, and
more at exit), the first time an optimizer is built or stepped: `Optimizer.step` calls
`torch._dynamo.graph_break()`, and methods marked `torch._disable_dynamo` wrap
themselves in `torch._dynamo.disable`. Both matter only while dynamo traces a function,
and nothing can be traced before torch._dynamo is imported. So, for the pinned torch
only, those two wrappers call the function directly while torch._dynamo is not
imported, and take torch's own path once it is (torch.compile, FSDP2 and torchtitan
import it). The suite starts hundreds of processes that train without compiling: Lab 1's
page and its tests took 254 s of CPU instead of 275 s.

3. DistributedDataParallel's constructor asks torch._dynamo which DDP mode the compiler
uses, and asking imports it. Until torch._dynamo is imported the answer is its default,
so the constructor gets it without the import. Lab 2's two-process run (`--max-steps 40`)
took 14.6 s of CPU instead of 17.9 s.

tests/docs/test_pinned_kernels.py checks that a DDP training run gives the same numbers
bit for bit, and that torch's own path is taken once torch._dynamo is imported.
"""

import functools
import gc
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType, SimpleNamespace
from typing import Any

YOUNG, MIDDLE, FULL = gc.get_threshold()  # (700, 10, 10) by default
gc.set_threshold(YOUNG, MIDDLE, 100 * FULL)  # a full collection 100 times less often

PINNED_TORCH = "2.14."  # the wrappers below are those of this torch; others stay as they are


def tracing_possible() -> bool:
    return "torch._dynamo" in sys.modules


def defer_disable_dynamo(module: ModuleType) -> None:
    """torch._compile._disable_dynamo: call the function itself until dynamo exists."""
    torchs = module._disable_dynamo

    def _disable_dynamo(fn: Callable | None = None, recursive: bool = True) -> Any:
        if fn is None:  # used as @_disable_dynamo(recursive=False)
            return functools.partial(_disable_dynamo, recursive=recursive)
        disabled = torchs(fn, recursive)

        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            return disabled(*args, **kwargs) if tracing_possible() else fn(*args, **kwargs)

        return inner

    module._disable_dynamo = _disable_dynamo


def defer_graph_break(module: ModuleType) -> None:
    """torch.optim.optimizer._use_grad_for_differentiable: the same grad mode around the
    step, without the graph breaks, until dynamo exists."""
    torchs, torch = module._use_grad_for_differentiable, sys.modules["torch"]

    def _use_grad_for_differentiable(func: Callable) -> Callable:
        traced = torchs(func)

        def _use_grad(*args: Any, **kwargs: Any) -> Any:
            if tracing_possible():
                return traced(*args, **kwargs)
            previous = torch.is_grad_enabled()
            try:
                torch.set_grad_enabled(args[0].defaults["differentiable"])
                return func(*args, **kwargs)
            finally:
                torch.set_grad_enabled(previous)

        return functools.update_wrapper(_use_grad, func)

    module._use_grad_for_differentiable = _use_grad_for_differentiable


def defer_ddp_optimizer_mode(module: ModuleType) -> None:
    """DistributedDataParallel.__init__ asks torch._dynamo which DDP mode the compiler is
    set to, and the question imports torch._dynamo. The setting can only be changed
    through torch._dynamo.config, so while torch._dynamo is not imported it has its
    default (``optimize_ddp = True``, "ddp_optimizer"): answer that without the import."""
    torchs_init, torch = module.DistributedDataParallel.__init__, sys.modules["torch"]
    utils = SimpleNamespace(get_optimize_ddp_mode=lambda: "ddp_optimizer")

    @functools.wraps(torchs_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if tracing_possible():
            return torchs_init(self, *args, **kwargs)
        stand_in = SimpleNamespace(utils=utils)  # only what __init__ reads
        torch._dynamo = stand_in
        try:
            return torchs_init(self, *args, **kwargs)
        finally:
            if torch.__dict__.get("_dynamo") is stand_in:
                del torch._dynamo  # the next use imports the real one, as before

    module.DistributedDataParallel.__init__ = __init__


AFTER_IMPORT = {
    "torch._compile": defer_disable_dynamo,
    "torch.optim.optimizer": defer_graph_break,
    "torch.nn.parallel.distributed": defer_ddp_optimizer_mode,
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs AFTER_IMPORT[name] on a module right after it is executed, before any other
    module can take names from it."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        change = AFTER_IMPORT.get(name)
        if change is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            if getattr(sys.modules.get("torch"), "__version__", "").startswith(PINNED_TORCH):
                change(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _AfterImport())
