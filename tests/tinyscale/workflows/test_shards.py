"""tinyscale.workflows.shards: the corpus tokenized once into shards, checked on open.

- The shards hold the labs' own token stream (core.data.build_datasets): the same ids,
  the same train / held-out split, in the smallest dtype, with an index that says so.
- Two ranks (run_on_ranks) split the shards and write the same bytes and index as one.
- A second run keeps complete shards and writes only the missing or broken ones; a run
  that dies leaves no index, so nothing reads a half-made directory.
- A truncated or corrupted shard is refused in one line naming the file and the fix.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import TIMEOUTS, one_line_error
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.data import build_datasets
from tinyscale.core.errors import UsageError
from tinyscale.workflows import shards
from tinyscale.workflows.shards import (
    INDEX,
    ShardSpec,
    fingerprint,
    open_shards,
    prepare,
    token_dtype,
    write_shards,
)

SPEC = ShardSpec(vocab_size=1024, shard_tokens=50000)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    prepare(SPEC, out, progress=False)
    return out


def stream(out: Path, split: str) -> np.ndarray:
    return np.concatenate(open_shards(out, split).memmaps())


def test_the_shards_hold_the_labs_token_stream(made: Path) -> None:
    data = build_datasets(vocab_size=1024, block_size=1)
    assert np.array_equal(stream(made, "train"), data.train.tokens.numpy())
    assert np.array_equal(stream(made, "heldout"), data.heldout.tokens.numpy())
    index = json.loads((made / INDEX).read_text())
    assert index["dtype"] == "uint16" and index["vocab_size"] == 1024
    assert index["tokenizer"] == fingerprint(data.tokenizer)
    train = index["splits"]["train"]
    assert [e["tokens"] for e in train[:-1]] == [SPEC.shard_tokens] * (len(train) - 1)
    for entry in train:  # a shard is its tokens, 2 bytes each, and nothing else
        assert (made / entry["file"]).stat().st_size == 2 * entry["tokens"]


def test_the_dtype_is_the_smallest_that_holds_every_id() -> None:
    assert token_dtype(2**16) == np.uint16  # ids 0 .. 65535
    assert token_dtype(2**16 + 1) == np.uint32


def test_ranks_split_the_shards_and_write_what_one_process_writes(
    made: Path, tmp_path: Path
) -> None:
    streams = {"train": np.arange(10, dtype=np.uint16), "heldout": np.arange(3, dtype=np.uint16)}
    spec = ShardSpec(shard_tokens=4)  # train: 3 shards, heldout: 1
    parts = [write_shards(streams, tmp_path, spec, rank=r, world_size=2) for r in range(2)]
    files = [[e["file"] for e in part] for part in parts]
    assert files == [
        ["train_00000.bin", "train_00002.bin"],
        ["train_00001.bin", "heldout_00000.bin"],
    ]

    out = tmp_path / "two_ranks"
    reports = run_on_ranks(prepare, 2, SPEC, str(out), False, **TIMEOUTS)
    assert [r["rank"] for r in reports] == [0, 1]
    assert reports[0]["written"] == reports[0]["shards"] == 6
    assert (out / INDEX).read_text() == (made / INDEX).read_text()
    for entry in json.loads((made / INDEX).read_text())["splits"]["train"]:
        assert (out / entry["file"]).read_bytes() == (made / entry["file"]).read_bytes()


def test_a_second_run_writes_only_what_is_missing_or_broken(made: Path, tmp_path: Path) -> None:
    out = tmp_path / "again"
    prepare(SPEC, out, progress=False)
    kept = out / "train_00000.bin"
    before = kept.stat().st_mtime_ns
    (out / "train_00001.bin").unlink()
    with (out / "train_00002.bin").open("r+b") as f:
        f.truncate(100)
    assert prepare(SPEC, out, progress=False)["written"] == 2
    assert kept.stat().st_mtime_ns == before  # untouched: checked, not rewritten
    assert (out / INDEX).read_text() == (made / INDEX).read_text()


def test_a_run_that_dies_leaves_no_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prepare(SPEC, tmp_path, progress=False)  # a complete directory, then a run that fails
    real, calls = shards.write_atomic, []

    def dies_on_the_third(path: Path, payload: bytes) -> None:
        calls.append(path)
        if len(calls) == 3:
            raise OSError("disk full")
        real(path, payload)

    monkeypatch.setattr(shards, "write_atomic", dies_on_the_third)
    (tmp_path / "train_00003.bin").unlink()
    (tmp_path / "train_00004.bin").unlink()
    (tmp_path / "heldout_00000.bin").unlink()
    with pytest.raises(OSError, match="disk full"):
        prepare(SPEC, tmp_path, progress=False)
    assert not (tmp_path / INDEX).exists()
    assert not list(tmp_path.glob(".*"))  # no temp file left behind
    message = one_line_error(open_shards, tmp_path)
    assert f"no index.json in {tmp_path}" in message
    assert f"re-run prepare_shards.py --out {tmp_path}" in message


def test_a_broken_shard_is_one_line_that_names_it_and_the_fix(tmp_path: Path) -> None:
    prepare(SPEC, tmp_path, progress=False)
    fix = f"re-run prepare_shards.py --out {tmp_path}"
    short = tmp_path / "train_00001.bin"
    with short.open("r+b") as f:
        f.truncate(99998)
    message = one_line_error(open_shards, tmp_path)
    assert f"shard {short} is 99,998 bytes, the index says 100,000" in message and fix in message
    short.unlink()
    assert f"shard {short} is missing" in one_line_error(open_shards, tmp_path)

    prepare(SPEC, tmp_path, progress=False)
    flipped = tmp_path / "heldout_00000.bin"
    payload = bytearray(flipped.read_bytes())
    payload[10] ^= 1  # one bit: the same size, other tokens
    flipped.write_bytes(bytes(payload))
    message = one_line_error(open_shards, tmp_path, "heldout")
    assert f"shard {flipped} fails its SHA-256 check" in message and fix in message
    assert open_shards(tmp_path, "heldout", verify=False).counts == (23608,)  # sizes only
    assert "no split 'test'" in one_line_error(open_shards, tmp_path, "test")


def test_a_shard_holds_at_least_two_tokens() -> None:
    with pytest.raises(UsageError, match="--shard-tokens must be at least 2, got 1"):
        ShardSpec(shard_tokens=1)
