"""tinyscale.ops.fragmentation: the fragmentation story the page tells, replayed through the
allocator model with each setting — measured, not asserted by hand; the command line; and,
where a GPU exists, the real allocator failing where the model does.
"""

import os

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
    replay_on_gpu,
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif("PYTORCH_CUDA_ALLOC_CONF" in os.environ, reason="default allocator only")
def test_the_real_allocator_fails_where_the_model_does() -> None:
    long_step, short_step = [210 * MiB] * 4, [50 * MiB] * 4
    ops = training_steps([long_step, short_step, long_step], keep_bytes=10 * MiB)
    real = replay_on_gpu(ops, capacity=GiB)
    assert real.ops_done == replay(ops, AllocatorConfig(capacity=GiB)).ops_done == 21
    assert real.oom and "200.00 MiB is reserved by PyTorch but unallocated" in real.oom
