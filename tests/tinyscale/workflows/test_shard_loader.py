"""tinyscale.workflows.shard_loader: the labs' blocks read from shards, rank by rank.

- ShardBlocks gives exactly TokenBlocks' blocks, also those that straddle two shards.
- In an epoch, the ranks read disjoint blocks that together cover the epoch; each rank
  reads only its share of the bytes.
- A loader resumed from its state dict sees the tokens an uninterrupted one sees, on the
  same or another world size, across an epoch boundary, with or without workers.
- The measurements count what they claim (a fake clock), the slow path and the
  streaming path read the text they claim to read, and bad input is one line.
"""

import itertools
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import one_line_error, recorded_output
from tinyscale.core.data import build_datasets, epoch_batches, stdlib_corpus_paths
from tinyscale.workflows import shard_loader
from tinyscale.workflows.shard_loader import (
    LoaderConfig,
    ShardBlocks,
    ShardLoader,
    TextFileBlocks,
    lab_datasets,
    loader_tokens_per_second,
    rank_share,
    stream_blocks,
)
from tinyscale.workflows.shards import TOKENIZER, ShardSpec, open_shards, prepare

BLOCK = 64


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    prepare(ShardSpec(vocab_size=1024, shard_tokens=50000), out, progress=False)
    return out


@pytest.fixture(scope="module")
def blocks(made: Path) -> ShardBlocks:
    return ShardBlocks(open_shards(made), BLOCK)


def test_shard_blocks_are_the_labs_blocks(made: Path) -> None:
    text = build_datasets(vocab_size=1024, block_size=BLOCK)
    shards = lab_datasets(corpus=f"shards:{made}", vocab_size=1024, block_size=BLOCK)
    assert shards.tokenizer.to_str() == text.tokenizer.to_str()
    for split in ("train", "heldout"):
        ours, theirs = getattr(shards, split), getattr(text, split)
        assert len(ours) == len(theirs)
        for i in range(len(ours)):  # every block, 781 of them straddling shards 0 and 1
            assert all(torch.equal(a, b) for a, b in zip(ours[i], theirs[i], strict=True))
    assert torch.equal(shards.heldout.tokens, text.heldout.tokens)
    assert 781 * BLOCK < 50000 < 782 * BLOCK  # block 781 does straddle


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_an_epoch_is_read_once_across_ranks_each_rank_its_share(
    made: Path, world_size: int
) -> None:
    cfg = LoaderConfig(global_batch_size=16)
    steps = 3319 // 16  # 207 full global batches; the last 7 blocks wait for the next epoch
    read, bytes_read = [], []
    for rank in range(world_size):
        order = rank_share(3319, cfg, rank=rank, world_size=world_size, position=0)
        read.append([i for batch in itertools.islice(order, steps) for i in batch])
        dataset = ShardBlocks(open_shards(made), BLOCK)
        loader = ShardLoader(dataset, cfg, rank=rank, world_size=world_size)
        assert sum(1 for _ in itertools.islice(loader, steps)) == steps
        bytes_read.append(dataset.bytes_read)
    every = [i for part in read for i in part]
    assert len(every) == len(set(every)) == steps * 16  # no block twice
    epoch = torch.cat(epoch_batches(3319, 16, seed=0, epoch=0)).tolist()
    assert set(every) == set(epoch)  # together: the whole epoch
    share = steps * 16 // world_size * (BLOCK + 1) * 2  # blocks x tokens x 2 bytes
    assert bytes_read == [share] * world_size


def global_batches(dataset: ShardBlocks, cfg: LoaderConfig, world_size: int, steps: int,
                   state: dict[str, int] | None = None) -> tuple[list[torch.Tensor], dict]:  # fmt: skip
    """``steps`` global batches read by ``world_size`` loaders, rows put back in order."""
    loaders = [ShardLoader(dataset, cfg, rank=r, world_size=world_size) for r in range(world_size)]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
    parts = [list(itertools.islice(loader, steps)) for loader in loaders]
    batches = []
    for step in range(steps):
        rows = torch.empty(cfg.global_batch_size, BLOCK, dtype=torch.long)
        for rank in range(world_size):
            rows[rank::world_size] = parts[rank][step][0]  # rank r holds rows r, r + N, ...
        batches.append(rows)
    states = {loader.state_dict()["position"] for loader in loaders}
    assert len(states) == 1  # every rank holds the same position
    return batches, loaders[0].state_dict()


def test_a_resume_reads_what_the_uninterrupted_run_reads_on_any_world_size(
    blocks: ShardBlocks,
) -> None:
    cfg = LoaderConfig(global_batch_size=16, seed=3)
    start = {"position": (207 - 2) * 16, "seed": 3, "global_batch_size": 16}  # 2 steps to go
    straight, end = global_batches(blocks, cfg, 2, 5, start)  # crosses into epoch 1
    first, middle = global_batches(blocks, cfg, 2, 3, start)
    resumed = ShardLoader(blocks, cfg)
    resumed.load_state_dict(middle)
    assert middle["position"] == 208 * 16 and resumed.epoch == 1  # 207 steps an epoch
    for world_size in (1, 4, 8):
        rest, last = global_batches(blocks, cfg, world_size, 2, middle)
        assert all(torch.equal(a, b) for a, b in zip(first + rest, straight, strict=True))
        assert last == end
    epoch1 = epoch_batches(len(blocks), 16, seed=3, epoch=1)[0]  # the new shuffle's first
    assert torch.equal(straight[2], torch.stack([blocks[i][0] for i in epoch1.tolist()]))


def test_workers_and_prefetch_change_nothing_but_the_speed(blocks: ShardBlocks) -> None:
    cfg = LoaderConfig(global_batch_size=8, seed=1)
    alone = list(itertools.islice(ShardLoader(blocks, cfg, rank=1, world_size=2), 6))
    workers = ShardLoader(blocks, LoaderConfig(global_batch_size=8, seed=1, num_workers=2),
                          rank=1, world_size=2)  # fmt: skip
    read = list(itertools.islice(workers, 6))
    for (x0, y0), (x1, y1) in zip(alone, read, strict=True):
        assert torch.equal(x0, x1) and torch.equal(y0, y1)
    assert workers.position == 6 * 8  # counted as the step took them, not as workers read


def test_the_loader_rate_counts_the_batches_after_the_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter([10.0, 12.0])  # start, stop: 2 s for the timed batches
    monkeypatch.setattr(shard_loader.time, "perf_counter", lambda: next(clock))
    batch = (torch.zeros(4, 8), torch.zeros(4, 8))
    taken = []
    batches = (taken.append(i) or batch for i in range(10))
    assert loader_tokens_per_second(batches, 3) == 3 * 32 / 2.0
    assert taken == [0, 1, 2, 3]  # the first (the workers' start) is read, not timed


def test_the_slow_path_reads_real_blocks_of_its_files(made: Path) -> None:
    tokenizer = lab_datasets(corpus=f"shards:{made}", vocab_size=1024, block_size=BLOCK).tokenizer
    paths = stdlib_corpus_paths()
    text = TextFileBlocks(paths, tokenizer, BLOCK)
    x, y = text[len(paths) + 2]  # file 2, its second block
    ids = tokenizer.encode(paths[2].read_text()).ids
    assert x.tolist() == ids[BLOCK : 2 * BLOCK] and y.tolist() == ids[BLOCK + 1 : 2 * BLOCK + 1]


def test_streaming_gives_each_rank_whole_files_when_they_divide(made: Path) -> None:
    tokenizer = lab_datasets(corpus=f"shards:{made}", vocab_size=1024, block_size=BLOCK).tokenizer
    paths = stdlib_corpus_paths()[:2]  # textwrap.py, string.py: one file per rank
    for rank, path in enumerate(paths):
        first = next(stream_blocks(paths, tokenizer, BLOCK, rank=rank, world_size=2))
        assert first.shape == (BLOCK + 1,)
        assert path.read_text().startswith(tokenizer.decode(first.tolist()))


def test_bad_input_is_one_line(made: Path, tmp_path: Path, blocks: ShardBlocks) -> None:
    message = one_line_error(lab_datasets, corpus=f"shards:{made}", vocab_size=260, block_size=16)
    assert "1024-token vocabulary, the model has 260" in message
    assert f"re-run prepare_shards.py --out {made}" in message
    (tmp_path / TOKENIZER).write_text((made / TOKENIZER).read_text())
    for name in ("index.json", "train_00000.bin", "train_00001.bin", "train_00002.bin",
                 "train_00003.bin", "train_00004.bin", "heldout_00000.bin"):  # fmt: skip
        (tmp_path / name).write_bytes((made / name).read_bytes())
    other = build_datasets(vocab_size=260, block_size=16).tokenizer
    other.save(str(tmp_path / TOKENIZER))
    message = one_line_error(lab_datasets, corpus=f"shards:{tmp_path}", vocab_size=1024,
                             block_size=BLOCK)  # fmt: skip
    assert "is not the tokenizer that made the shards" in message
    message = one_line_error(ShardLoader, blocks, LoaderConfig(global_batch_size=16), world_size=3)
    assert "a global batch of 16 does not split over 3 ranks" in message
    loader = ShardLoader(blocks, LoaderConfig(global_batch_size=16))
    state = {"position": 32, "seed": 5, "global_batch_size": 16}
    assert "resume with --seed 5" in one_line_error(loader.load_state_dict, state)
    assert "blocks hold no global batch" in one_line_error(
        ShardLoader, blocks, LoaderConfig(global_batch_size=4096)
    )
    tiny = ShardBlocks(open_shards(made, "heldout"), BLOCK)
    with pytest.raises(Exception, match="for blocks of 30000"):
        ShardBlocks(tiny.shards, 30000)
    assert np.dtype(tiny.shards.dtype) == np.uint16


def test_the_page_counts_the_bytes_each_rank_reads() -> None:
    """Data at scale: each rank reads its steps x rows x (block + 1) tokens x 2 bytes."""
    lines = recorded_output("workflows/data-at-scale.md", 'demo("runs/shards"')
    pattern = r"rank (\d): (\d+) steps of (\d+) blocks, ([\d,]+) bytes read of ([\d,]+) on disk"
    on_disk = 212467 * 2  # the train split's tokens, 2 bytes each
    for line in lines[:2]:
        _, steps, rows, read, disk = re.match(pattern, line).groups()
        assert int(read.replace(",", "")) == int(steps) * int(rows) * (BLOCK + 1) * 2
        assert int(disk.replace(",", "")) == on_disk
    assert (
        lines[2]
        == f"{int(steps) * 16} blocks read, {int(steps) * 16} different, of 3319 in the epoch"
    )
