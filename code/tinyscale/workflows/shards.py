# --8<-- [start:format]
"""Pre-tokenized shards: the corpus tokenized once, written as flat token arrays on disk.

Launch:  python code/scripts/prepare_shards.py --out runs/shards --shard-tokens 65536

A shard is a file of raw token ids (uint16 while the vocabulary fits, uint32 beyond),
nothing else: numpy memory-maps it, so reading block i costs one slice of the file. The
index, index.json, lists every shard with its token count and SHA-256, and says which
tokenizer made the ids. It is written last: a directory without one is unfinished.
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist
from tokenizers import Tokenizer
from tqdm import tqdm

from tinyscale.core.data import build_datasets, write_atomic
from tinyscale.core.errors import UsageError
from tinyscale.core.outputs import check_writable

INDEX = "index.json"
TOKENIZER = "tokenizer.json"
SPLITS = ("train", "heldout")
FIX = "re-run prepare_shards.py --out {out}"  # how every broken directory is mended


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer that holds every id: 2 bytes per token up to 65,536."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def fingerprint(tokenizer: Tokenizer) -> str:
    """A short hash of the tokenizer: ids made by another tokenizer mean other words."""
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()[:16]


def shard_name(split: str, k: int) -> str:
    return f"{split}_{k:05d}.bin"


# --8<-- [end:format]


# --8<-- [start:write]
@dataclass(frozen=True, kw_only=True)
class ShardSpec:
    """What to tokenize and how to cut it: the same corpus, tokenizer and split as the labs."""

    corpus: str = "stdlib"
    vocab_size: int = 1024
    shard_tokens: int = 65536  # tokens per shard file; the last one of a split is shorter

    def __post_init__(self) -> None:
        if self.shard_tokens < 2:
            raise UsageError(f"--shard-tokens must be at least 2, got {self.shard_tokens}")


def tokenize_once(spec: ShardSpec) -> tuple[Tokenizer, dict[str, np.ndarray]]:
    """The labs' own token streams (core.data.build_datasets): the same ids, the same split."""
    data = build_datasets(corpus=spec.corpus, vocab_size=spec.vocab_size, block_size=1)
    dtype = token_dtype(spec.vocab_size)
    streams = {"train": data.train.tokens, "heldout": data.heldout.tokens}
    return data.tokenizer, {split: t.numpy().astype(dtype) for split, t in streams.items()}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_shards(
    streams: dict[str, np.ndarray], out: Path, spec: ShardSpec, *, rank: int = 0,
    world_size: int = 1, progress: bool | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Write this rank's shards, k = rank, rank + N, ... of every split; skip finished ones.

    A shard already on disk with the right SHA-256 is kept: a killed run, started again,
    only writes what is missing.
    """
    jobs = [
        (split, k, stream[start : start + spec.shard_tokens])
        for split, stream in streams.items()
        for k, start in enumerate(range(0, len(stream), spec.shard_tokens))
    ]
    mine = [job for i, job in enumerate(jobs) if i % world_size == rank]
    entries = []
    hide = rank > 0 or (None if progress is None else not progress)  # None: in a terminal only
    for split, k, tokens in tqdm(mine, desc=f"rank {rank} shards", unit="shard", disable=hide):
        path, payload = out / shard_name(split, k), tokens.tobytes()
        digest = hashlib.sha256(payload).hexdigest()
        done = (
            path.is_file() and path.stat().st_size == len(payload) and sha256_file(path) == digest
        )
        if not done:
            write_atomic(path, payload)
        entries.append({"split": split, "k": k, "file": path.name, "tokens": len(tokens),
                        "sha256": digest, "written": not done})  # fmt: skip
    return entries


def shard_entry(entry: dict[str, Any]) -> dict[str, Any]:
    return {"file": entry["file"], "tokens": entry["tokens"], "sha256": entry["sha256"]}


def write_index(
    out: Path, entries: list[dict[str, Any]], tokenizer: Tokenizer, spec: ShardSpec
) -> dict[str, Any]:
    """The index, written last (after every rank's shards): it makes the directory usable."""
    write_atomic(out / TOKENIZER, tokenizer.to_str().encode())
    ordered = sorted(entries, key=lambda e: (SPLITS.index(e["split"]), e["k"]))
    index = {
        "dtype": token_dtype(spec.vocab_size).name,
        "vocab_size": spec.vocab_size,
        "tokenizer": fingerprint(tokenizer),
        "corpus": spec.corpus,
        "shard_tokens": spec.shard_tokens,
        "splits": {split: [shard_entry(e) for e in ordered if e["split"] == split]
                   for split in SPLITS},
    }  # fmt: skip
    write_atomic(out / INDEX, json.dumps(index, indent=1).encode())
    return index


def check_out(out: str | Path) -> None:
    """Every place ``prepare`` writes in ``out`` (core.outputs): the folder, its index, its
    tokenizer and its shards, checked before the first is written."""
    check_writable(out, "--out")
    for name in (INDEX, TOKENIZER):
        check_writable(out, "--out", name, file=True)
    for split in SPLITS:  # a shard's name taken by a folder
        for path in sorted(Path(out).glob(f"{split}_*.bin")):
            check_writable(out, "--out", path.name, file=True)


def prepare(spec: ShardSpec, out: str | Path, progress: bool | None = None) -> dict[str, Any]:
    """Tokenize, write this rank's shards, and (rank 0, after all ranks) the index.

    One process, or every rank of a launch (torchrun, or run_on_ranks in the tests): the
    ranks split the shards between them and meet once, to hand rank 0 their entries.
    Nothing is created before ``out`` and the corpus are checked.
    """
    out = Path(out)
    check_out(out)
    tokenizer, streams = tokenize_once(spec)  # a corpus that is not there: one line
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    out.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        (out / INDEX).unlink(missing_ok=True)  # unfinished until the new index is written
    entries = write_shards(streams, out, spec, rank=rank, world_size=world, progress=progress)
    every = [entries]
    if world > 1:
        every = [None] * world
        dist.all_gather_object(every, entries)  # bounded by the process group's timeout
    gathered = [e for rank_entries in every for e in rank_entries]
    if rank == 0:
        write_index(out, gathered, tokenizer, spec)
    return {"rank": rank, "world_size": world, "shards": len(gathered),
            "written": sum(e["written"] for e in gathered)}  # fmt: skip


# --8<-- [end:write]


# --8<-- [start:open]
@dataclass(frozen=True, kw_only=True)
class ShardSet:
    """One split of a shard directory, checked: its files, their token counts, their dtype."""

    directory: Path
    paths: tuple[Path, ...]
    counts: tuple[int, ...]
    dtype: np.dtype
    vocab_size: int
    tokenizer: str  # fingerprint

    def memmaps(self) -> list[np.memmap]:
        """Map every shard read-only: nothing is read until a slice is touched."""
        return [
            np.memmap(p, dtype=self.dtype, mode="r", shape=(n,))
            for p, n in zip(self.paths, self.counts, strict=True)
        ]


def open_shards(directory: str | Path, split: str = "train", *, verify: bool = True) -> ShardSet:
    """Read the index and check every shard: size always, SHA-256 when ``verify``.

    Each problem is one line that names the file and the fix.
    """
    out = Path(directory)
    fix = FIX.format(out=out)
    if not (out / INDEX).is_file():
        raise UsageError(f"no {INDEX} in {out}: the shards are missing or unfinished; {fix}")
    index = json.loads((out / INDEX).read_text())
    if split not in index["splits"]:
        raise UsageError(f"{out / INDEX} has no split '{split}': use one of {', '.join(SPLITS)}")
    dtype = np.dtype(index["dtype"])
    paths, counts = [], []
    for entry in index["splits"][split]:
        path, expected = out / entry["file"], entry["tokens"] * dtype.itemsize
        size = path.stat().st_size if path.is_file() else None
        if size != expected:
            found = "missing" if size is None else f"{size:,} bytes, the index says {expected:,}"
            raise UsageError(f"shard {path} is {found} (truncated or replaced): {fix}")
        if verify and sha256_file(path) != entry["sha256"]:
            raise UsageError(f"shard {path} fails its SHA-256 check (corrupted): {fix}")
        paths.append(path)
        counts.append(entry["tokens"])
    return ShardSet(directory=out, paths=tuple(paths), counts=tuple(counts), dtype=dtype,
                    vocab_size=index["vocab_size"], tokenizer=index["tokenizer"])  # fmt: skip


# --8<-- [end:open]
