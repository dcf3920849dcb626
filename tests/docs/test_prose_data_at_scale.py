"""Numbers in the prose of "Data at scale" (docs/workflows/data-at-scale.md) that no output
block shows, checked against the code and the page's recorded run:

- the size of the labs' corpus (the standard-library sources, read from this Python);
- the shards' token type: 2 bytes while the vocabulary has at most 65,536 entries
  (tinyscale.workflows.shards.token_dtype), and the held-out tenth of the stream
  (core.data.build_datasets' default);
- who reads what: the bytes each rank read in the recorded epoch are its blocks of
  block_size + 1 tokens, half the epoch's blocks plus one token per block, no block twice.
"""

from __future__ import annotations

import inspect
import re

import pytest

from helpers import fails_when_changed, prose, recorded_output, said
from tinyscale.core.config import load_model_config
from tinyscale.core.data import build_datasets, stdlib_corpus_paths
from tinyscale.workflows.shard_loader import LoaderConfig
from tinyscale.workflows.shards import token_dtype

PAGE = "workflows/data-at-scale.md"


def check_corpus_size(text: str) -> None:
    (kb,) = said(text, r"That is fine for (\d+) kB of Python sources")
    size = sum(p.stat().st_size for p in stdlib_corpus_paths())
    assert int(kb) * 1000 == round(size, -5), f"{size:,} bytes"  # one significant figure


def check_token_type(text: str) -> None:
    nbytes, entries = said(
        text, r"plain files of `uint16` numbers \((\d) bytes per token while the vocabulary has "
        r"at most ([\d,]+) entries\)",
    )  # fmt: skip
    most = int(entries.replace(",", ""))
    assert token_dtype(most) == "uint16" and token_dtype(most).itemsize == int(nbytes)
    assert token_dtype(most + 1).itemsize > int(nbytes)  # one more entry: a wider type
    assert token_dtype(load_model_config().vocab_size).itemsize == int(nbytes)


def check_heldout_share(text: str) -> None:
    (percent,) = said(text, r"splits off the last (\d+) % as held-out")
    default = inspect.signature(build_datasets).parameters["heldout_fraction"].default
    assert int(percent) == round(100 * default)


def check_who_reads_what(text: str) -> None:
    steps, blocks, tokens, nbytes, total = said(
        text,
        r"Each rank reads (\d+) × (\d+) blocks × (\d+) tokens × (\d) bytes = ([\d,]+) bytes: "
        r"half the epoch, plus one token per block that its neighbour also reads\. No block "
        r"is read twice; the (?:\d+) blocks that do not fill a global batch wait",
    )
    lines = recorded_output(PAGE, 'demo("runs/shards"')
    ranks = [re.match(r"rank \d: (\d+) steps of (\d+) blocks, ([\d,]+) bytes read", line)
             for line in lines[:2]]  # fmt: skip
    assert all(m and m.groups() == (steps, blocks, total) for m in ranks), lines
    cfg = load_model_config()
    assert int(tokens) == cfg.max_position_embeddings + 1  # a block and its target's last token
    assert int(nbytes) == token_dtype(cfg.vocab_size).itemsize
    per_rank = int(steps) * int(blocks)
    assert per_rank * int(tokens) * int(nbytes) == int(total.replace(",", ""))
    read, different, epoch = (int(v) for v in re.findall(r"\d+", lines[2]))
    assert 2 * per_rank == read == different  # half the epoch each, no block twice
    (left,) = said(text, r"No block is read twice; the (\d+) blocks that do not fill")
    assert epoch - read == int(left) < LoaderConfig().global_batch_size


@pytest.mark.parametrize(
    "check", [check_corpus_size, check_token_type, check_heldout_share, check_who_reads_what]
)
def test_the_pages_numbers_are_the_code_and_the_recorded_run(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_corpus_size, "fine for 700 kB", "fine for 900 kB"),
        (check_token_type, "at most 65,536 entries", "at most 32,768 entries"),
        (check_heldout_share, "the last 10 % as held-out", "the last 20 % as held-out"),
        (check_who_reads_what, "× 65 tokens × 2 bytes", "× 64 tokens × 2 bytes"),
        (check_who_reads_what, "the 7 blocks", "the 8 blocks"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
