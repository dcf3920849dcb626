"""tinyscale.ops.fragmentation: the fragmentation story the page tells, replayed through the
allocator model with each setting — measured, not asserted by hand; the command line; and,
where a GPU exists, each of the three settings on the real allocator, in a process of its
own, giving the model's row (skipped without a GPU: "needs GPUs").
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from tinyscale.core.errors import UsageError
from tinyscale.core.memory import MiB
from tinyscale.ops.allocator import AllocatorConfig
from tinyscale.ops.fragmentation import (
    SETTINGS,
    main,
    memory_map,
    replay,
    training_steps,
)

GiB = 1024 * MiB


def test_the_page_story_fragmentation_not_lack_of_memory() -> None:
    long_step, short_step = [210 * MiB] * 4, [50 * MiB] * 4
    ops = training_steps([long_step, short_step, long_step], keep_bytes=10 * MiB)
    results = {
        label: replay(ops, AllocatorConfig(capacity=GiB, **kw)) for label, kw in SETTINGS.items()
    }
    default = results["(default)"]
    assert default.oom is not None and default.ops_done == 21  # the 4th long activation
    s = default.allocator.stats()
    free_on_device = GiB - s.reserved
    # Enough memory in total, not in one piece: the definition of fragmentation.
    assert s.reserved_unallocated + free_on_device >= 210 * MiB
    assert s.largest_free < 210 * MiB and free_on_device < 210 * MiB
    assert memory_map(default.allocator)[0] == "segment 0 (210 MiB): free 200 | used 10"
    for label in ("max_split_size_mb:64", "expandable_segments:True"):
        assert results[label].oom is None and results[label].ops_done == len(ops), label
    assert results["expandable_segments:True"].peak_reserved <= 880 * MiB


def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "(default)                  21/27" in out
    assert "expandable_segments:True   27/27" in out
    with pytest.raises(UsageError, match="positive"):
        main(["--layers", "0"])
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="--gpu needs a CUDA GPU"):
            main(["--gpu"])


# The real allocator reads PYTORCH_CUDA_ALLOC_CONF once, when CUDA starts: each setting is a
# fresh process, given its value (or none) whatever this process was started with.
ON_GPU = """
import json
from tinyscale.core.memory import MiB
from tinyscale.ops.fragmentation import replay_on_gpu, training_steps
long_step, short_step = [210 * MiB] * 4, [50 * MiB] * 4
ops = training_steps([long_step, short_step, long_step], keep_bytes=10 * MiB)
r = replay_on_gpu(ops, capacity=1024 * MiB)
print(json.dumps([r.ops_done, r.oom, r.peak_allocated, r.peak_reserved]))
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs GPUs")
@pytest.mark.parametrize("label", list(SETTINGS))
def test_the_real_allocator_gives_the_model_row(label: str) -> None:
    """Each row of the page's table, on a GPU: the same operations done, the same peaks."""
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    if label != "(default)":
        env["PYTORCH_CUDA_ALLOC_CONF"] = label
    out = subprocess.run(
        [sys.executable, "-c", ON_GPU],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    ops_done, oom, peak_allocated, peak_reserved = json.loads(out.splitlines()[-1])
    long_step, short_step = [210 * MiB] * 4, [50 * MiB] * 4
    ops = training_steps([long_step, short_step, long_step], keep_bytes=10 * MiB)
    model = replay(ops, AllocatorConfig(capacity=GiB, **SETTINGS[label]))
    assert (ops_done, oom is None) == (model.ops_done, model.oom is None)
    assert (peak_allocated, peak_reserved) == (model.peak_allocated, model.peak_reserved)
    if label == "(default)":  # fails at the 4th long activation, as the model does
        assert ops_done == 21 and "200.00 MiB is reserved by PyTorch but unallocated" in oom
