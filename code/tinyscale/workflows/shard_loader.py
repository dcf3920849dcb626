# --8<-- [start:blocks]
"""A distributed loader over token shards: each rank reads its own blocks, resumes exactly.

Try it:  python -c "from tinyscale.workflows.shard_loader import demo; demo('runs/shards')"

The blocks are the labs' blocks (core.data.TokenBlocks), read from memory-mapped shards
instead of a tensor in memory. The order of an epoch is one global shuffle, cut into
global batches; rank r takes rows r, r + N, ... of each. The position saved in a
checkpoint is the count of samples all ranks consumed: it means the same on any number
of ranks, so a run resumed on another world size reads exactly the tokens still due.
"""

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from tinyscale.core.data import LMData, TokenBlocks, build_datasets, epoch_batches
from tinyscale.core.errors import UsageError
from tinyscale.core.model import TinyTransformer
from tinyscale.core.training import TrainConfig, make_optimizer
from tinyscale.workflows.shards import TOKENIZER, ShardSet, fingerprint, open_shards


class ShardBlocks(TokenBlocks):
    """TokenBlocks over shards on disk: block i is tokens [i*T, i*T + T + 1) of the stream.

    A block may straddle two shards; it is the same block as in memory, so a run on the
    shards trains on exactly the tokens of a run on the text.
    """

    def __init__(self, shards: ShardSet, block_size: int) -> None:
        self.shards, self.block_size = shards, block_size
        self.starts = np.concatenate([[0], np.cumsum(shards.counts)])  # each shard's offset
        if self.starts[-1] < block_size + 1:
            raise UsageError(
                f"only {self.starts[-1]} tokens in {shards.directory} for blocks of "
                f"{block_size}: prepare a bigger corpus or use a smaller block size"
            )
        self.bytes_read = 0  # counted in the process that reads (a worker counts its own)
        self._maps: list[np.memmap] | None = None

    def __len__(self) -> int:
        return (int(self.starts[-1]) - 1) // self.block_size

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the stream, from one shard or across a boundary."""
        if self._maps is None:  # mapped in the process that reads: each worker its own
            self._maps = self.shards.memmaps()
        parts, k = [], int(np.searchsorted(self.starts, start, side="right")) - 1
        while start < stop:
            lo, hi = start - self.starts[k], min(stop, self.starts[k + 1]) - self.starts[k]
            parts.append(self._maps[k][lo:hi])
            start, k = int(self.starts[k] + hi), k + 1
        chunk = np.concatenate(parts)  # a copy: the pages of the map are not kept
        self.bytes_read += chunk.nbytes
        return chunk

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.block_size
        chunk = torch.from_numpy(self.read(start, start + self.block_size + 1).astype(np.int64))
        return chunk[:-1], chunk[1:]

    @property
    def tokens(self) -> torch.Tensor:
        """The whole stream in memory, as TokenBlocks holds it (for small splits)."""
        return torch.from_numpy(self.read(0, int(self.starts[-1])).astype(np.int64))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": None}  # a worker maps the files again, not copies


# --8<-- [end:blocks]


# --8<-- [start:lab_data]
SHARDS = "shards:"  # --corpus shards:DIR reads the shards that prepare_shards.py wrote
SHARDS_NOTE = "or shards:DIR, the shards prepare_shards.py wrote there"


def lab_datasets(*, corpus: str, vocab_size: int, block_size: int) -> LMData:
    """The labs' data: a corpus tokenized now (core.data), or shards tokenized before."""
    if not corpus.startswith(SHARDS):
        return build_datasets(corpus=corpus, vocab_size=vocab_size, block_size=block_size)
    directory = Path(corpus.removeprefix(SHARDS))
    train, heldout = open_shards(directory, "train"), open_shards(directory, "heldout")
    if train.vocab_size != vocab_size:
        raise UsageError(
            f"the shards in {directory} hold ids of a {train.vocab_size}-token vocabulary, the "
            f"model has {vocab_size}: re-run prepare_shards.py --out {directory} --config "
            "with the model's config"
        )
    tokenizer = Tokenizer.from_file(str(directory / TOKENIZER))
    if fingerprint(tokenizer) != train.tokenizer:
        raise UsageError(
            f"{directory / TOKENIZER} is not the tokenizer that made the shards: "
            f"re-run prepare_shards.py --out {directory}"
        )
    return LMData(
        tokenizer=tokenizer,
        train=ShardBlocks(train, block_size),
        heldout=ShardBlocks(heldout, block_size),
    )


# --8<-- [end:lab_data]


# --8<-- [start:order]
@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    global_batch_size: int = 16  # samples per step, all ranks together
    seed: int = 0
    num_workers: int = 0  # processes that read ahead; 0 reads in the training process
    prefetch_factor: int = 2  # batches each worker keeps ready
    timeout_s: float = 60.0  # the longest wait for a worker's batch


def rank_share(
    num_blocks: int, cfg: LoaderConfig, *, rank: int, world_size: int, position: int
) -> Iterator[list[int]]:
    """This rank's rows of every global batch from ``position`` on, epoch after epoch.

    The global batches are Lab 1's (core.data.epoch_batches: a shuffle by seed + epoch,
    the last incomplete batch dropped): they do not depend on the world size.
    """
    per_epoch = num_blocks // cfg.global_batch_size
    step = position // cfg.global_batch_size
    while True:
        epoch, index = divmod(step, per_epoch)
        batches = epoch_batches(num_blocks, cfg.global_batch_size, seed=cfg.seed, epoch=epoch)
        for batch in batches[index:]:
            yield batch[rank::world_size].tolist()  # rows r, r + N, ...
        step = (epoch + 1) * per_epoch


# --8<-- [end:order]


# --8<-- [start:loader]
class ShardLoader:
    """A rank's batches, read ahead by DataLoader workers; its position goes in checkpoints."""

    def __init__(
        self, dataset: TokenBlocks, cfg: LoaderConfig, *, rank: int = 0, world_size: int = 1
    ) -> None:
        if cfg.global_batch_size % world_size:
            raise UsageError(
                f"a global batch of {cfg.global_batch_size} does not split over {world_size} "
                "ranks: use a world size that divides it"
            )
        if len(dataset) < cfg.global_batch_size:
            raise UsageError(
                f"{len(dataset)} blocks hold no global batch of {cfg.global_batch_size}: "
                "lower the global batch size"
            )
        self.dataset, self.cfg, self.rank, self.world_size = dataset, cfg, rank, world_size
        self.position = 0  # samples all ranks consumed: the same number on every rank

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "seed": self.cfg.seed,
                "global_batch_size": self.cfg.global_batch_size}  # fmt: skip

    def load_state_dict(self, state: dict[str, int]) -> None:
        if (state["seed"], state["global_batch_size"]) != (
            self.cfg.seed,
            self.cfg.global_batch_size,
        ):
            raise UsageError(
                f"the saved position is in another order: resume with --seed {state['seed']} "
                f"--global-batch-size {state['global_batch_size']}"
            )
        self.position = state["position"]

    @property
    def epoch(self) -> int:
        per_epoch = len(self.dataset) // self.cfg.global_batch_size  # full global batches
        return self.position // (per_epoch * self.cfg.global_batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        workers = self.cfg.num_workers
        batches = rank_share(len(self.dataset), self.cfg, rank=self.rank,
                             world_size=self.world_size, position=self.position)  # fmt: skip
        loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_sampler=batches,
            num_workers=workers,
            prefetch_factor=self.cfg.prefetch_factor if workers else None,
            timeout=self.cfg.timeout_s if workers else 0,
        )
        for x, y in loader:
            self.position += self.cfg.global_batch_size  # when the step gets it, not when read
            yield x, y


# --8<-- [end:loader]


# --8<-- [start:measure]
def loader_tokens_per_second(batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                             num_batches: int) -> float:  # fmt: skip
    """How fast a loader hands out tokens alone, after its first batch (workers' start)."""
    it = iter(batches)
    next(it)
    tokens, t0 = 0, time.perf_counter()
    for _ in range(num_batches):
        x, _ = next(it)
        tokens += x.numel()
    return tokens / (time.perf_counter() - t0)


def step_tokens_per_second(model: TinyTransformer, x: torch.Tensor, steps: int) -> float:
    """How fast the training step eats tokens alone: forward, backward, AdamW, on one batch."""
    optimizer = make_optimizer(model, TrainConfig())
    for i in range(steps + 1):
        if i == 1:  # the first step pays for the optimizer's setup
            t0 = time.perf_counter()
        _, loss = model(x, x)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return steps * x.numel() / (time.perf_counter() - t0)


class TextFileBlocks(torch.utils.data.Dataset):
    """The slow path: every block re-reads its text file and tokenizes all of it, on the fly."""

    def __init__(self, paths: list[Path], tokenizer: Tokenizer, block_size: int) -> None:
        self.paths, self.tokenizer, self.block_size = paths, tokenizer, block_size

    def __len__(self) -> int:
        return len(self.paths) * 64  # up to 64 blocks of each file

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = self.tokenizer.encode(self.paths[i % len(self.paths)].read_text()).ids
        start = (i // len(self.paths)) * self.block_size % (len(ids) - self.block_size - 1)
        chunk = torch.tensor(ids[start : start + self.block_size + 1])
        return chunk[:-1], chunk[1:]


# --8<-- [end:measure]


# --8<-- [start:stream]
def stream_blocks(
    paths: list[Path], tokenizer: Tokenizer, block_size: int, *, rank: int, world_size: int
) -> Iterator[torch.Tensor]:
    """The other way: stream the text with Hugging Face datasets, tokenize as it comes.

    Nothing is prepared; each rank gets whole files when their number divides by the
    world size, else every rank reads every line and keeps one in N.
    """
    from datasets import load_dataset  # a heavy import, for this path only
    from datasets.distributed import split_dataset_by_node

    files = [str(p) for p in paths]
    lines = load_dataset("text", data_files=files, split="train", streaming=True,
                         keep_linebreaks=True)  # fmt: skip
    buffer: list[int] = []
    for row in split_dataset_by_node(lines, rank=rank, world_size=world_size):
        buffer.extend(tokenizer.encode(row["text"]).ids)
        while len(buffer) > block_size:
            yield torch.tensor(buffer[: block_size + 1])  # input and target, as a block
            del buffer[:block_size]


# --8<-- [end:stream]


# --8<-- [start:demo]
def lab_blocks(directory: str | Path, block_size: int = 64) -> ShardBlocks:
    """The training blocks of a shard directory, checked (the lab model's block size)."""
    return ShardBlocks(open_shards(directory, "train"), block_size)


def demo(directory: str | Path = "runs/shards", world_size: int = 2) -> None:
    """One epoch read by ``world_size`` ranks (here in turn, in one process): who read what."""
    seen: list[int] = []
    for rank in range(world_size):
        blocks = lab_blocks(directory)
        loader = ShardLoader(blocks, LoaderConfig(), rank=rank, world_size=world_size)
        steps = len(blocks) // loader.cfg.global_batch_size  # one epoch
        order = rank_share(len(blocks), loader.cfg, rank=rank, world_size=world_size, position=0)
        seen += [i for _, batch in zip(range(steps), order, strict=False) for i in batch]
        batches = [x for _, (x, _) in zip(range(steps), loader, strict=False)]
        on_disk = sum(blocks.shards.counts) * blocks.shards.dtype.itemsize
        print(f"rank {rank}: {steps} steps of {len(batches[0])} blocks, {blocks.bytes_read:,} bytes "
              f"read of {on_disk:,} on disk, position {loader.position}")  # fmt: skip
    print(f"{len(seen)} blocks read, {len(set(seen))} different, of {len(blocks)} in the epoch")


def feed_check(directory: str | Path = "runs/shards", batches: int = 2) -> None:
    """Can the loader feed the step? Each loader's tokens/s beside the lab model's step."""
    from tinyscale.core.config import load_model_config
    from tinyscale.core.data import stdlib_corpus_paths

    blocks = lab_blocks(directory)
    torch.manual_seed(0)
    x = blocks[0][0].repeat(16, 1)  # a batch of the lab's shape, (16, 64)
    step = step_tokens_per_second(TinyTransformer(load_model_config()), x, steps=5)
    print(f"training step, lab model, batch 16 x 64: {step:,.0f} tokens/s")
    tokenizer = Tokenizer.from_file(str(Path(directory) / TOKENIZER))
    text = TextFileBlocks(stdlib_corpus_paths(), tokenizer, 64)
    loaders = {
        "text files, tokenized on the fly, 0 workers": (text, 0),
        "text files, tokenized on the fly, 2 workers": (text, 2),
        "shards, 0 workers": (blocks, 0),
    }
    for name, (dataset, workers) in loaders.items():
        loader = ShardLoader(dataset, LoaderConfig(num_workers=workers))
        rate = loader_tokens_per_second(loader, batches)
        verdict = "keeps up" if rate > step else "the bottleneck: the step waits for it"
        print(f"{name}: {rate:,.0f} tokens/s, {verdict}")


# --8<-- [end:demo]
