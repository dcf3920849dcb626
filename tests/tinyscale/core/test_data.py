"""tinyscale.core.data: the offline corpus, the byte-level BPE tokenizer and its cache, token blocks,
the train/held-out split, and the checksummed, cached download of a public corpus.

Every test that touches the cache points TINYSCALE_CACHE at its own tmp_path; downloads use
``file://`` URLs, so nothing leaves the machine.
"""

import hashlib
import random
from pathlib import Path

import pytest
import torch

from tinyscale.core import data
from tinyscale.core.data import (
    EOT,
    PublicCorpus,
    TokenBlocks,
    build_datasets,
    download_corpus,
    encode_corpus,
    load_corpus,
    stdlib_corpus_paths,
    train_tokenizer,
)
from tinyscale.core.errors import UsageError


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("TINYSCALE_CACHE", str(path))
    assert data.cache_dir() == path
    return path


@pytest.fixture(scope="module")
def documents() -> list[str]:
    """A few real documents: small enough to train a tokenizer in well under a second."""
    return [p.read_text(encoding="utf-8") for p in stdlib_corpus_paths()[:3]]


def files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()] if path.exists() else []


def test_stdlib_corpus_paths_exist() -> None:
    paths = stdlib_corpus_paths()
    assert len(paths) == len(data.STDLIB_FILES) == len(set(paths))
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)
    documents = load_corpus("stdlib")
    assert documents == [p.read_text(encoding="utf-8") for p in paths]


def test_load_corpus_from_a_text_file(tmp_path: Path) -> None:
    path = tmp_path / "text.txt"
    path.write_text("To be, or not to be.\n", encoding="utf-8")
    assert load_corpus(str(path)) == ["To be, or not to be.\n"]


def test_load_corpus_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        load_corpus(str(tmp_path / "missing.txt"))
    message = str(info.value)
    assert "\n" not in message and "stdlib" in message and "check the path" in message


def random_text(rng: random.Random, length: int) -> str:
    alphabet = [chr(c) for c in range(32, 127)] + list(
        "\t\n\r éüß€—…日本語中文한국어😀🙂Ωπ∑\u200b\x00"
    )
    return "".join(rng.choice(alphabet) for _ in range(length))


def test_tokenizer_round_trips_any_text(cache: Path, documents: list[str]) -> None:
    tokenizer = train_tokenizer(documents, 300)
    rng = random.Random(0)
    samples = [
        documents[0][:2000],
        "héllo wörld — naïve café, 日本語のテキスト, emoji 😀🙂, math ∑πΩ",
        "  leading and trailing spaces  \n\n\ttabs\r\nCRLF",
        "",
        *(random_text(rng, n) for n in (1, 7, 64, 500)),
    ]
    for text in samples:
        ids = tokenizer.encode(text).ids
        assert all(0 <= i < 300 for i in ids)
        assert tokenizer.decode(ids) == text
    # byte-level: characters never seen in training still encode, as bytes, without <unk>
    unseen = "ᚠᛇᚻ᛫ᛒᛦᚦ"
    assert not any(unseen[0] in d for d in documents)
    assert tokenizer.decode(tokenizer.encode(unseen).ids) == unseen
    # merges do compress the text they were trained on
    assert len(tokenizer.encode(documents[0]).ids) < 0.8 * len(documents[0].encode())


@pytest.mark.parametrize("vocab_size", [260, 300, 512])
def test_vocab_size_is_honoured(cache: Path, documents: list[str], vocab_size: int) -> None:
    tokenizer = train_tokenizer(documents, vocab_size)
    assert tokenizer.get_vocab_size() == vocab_size
    assert tokenizer.token_to_id(EOT) is not None


def test_tokenizer_cache_returns_the_same_tokenizer(cache: Path, documents: list[str]) -> None:
    first = train_tokenizer(documents, 300)
    cached = files_under(cache)
    assert len(cached) == 1 and cached[0].parent.name == "tokenizers"
    mtime = cached[0].stat().st_mtime_ns
    second = train_tokenizer(documents, 300)
    assert second.to_str() == first.to_str()
    assert cached[0].stat().st_mtime_ns == mtime  # read back, not trained and written again
    assert files_under(cache) == cached
    # a different corpus or vocab size is a different cache entry
    train_tokenizer(documents[:2], 300)
    train_tokenizer(documents, 280)
    assert len(files_under(cache)) == 3


def test_token_blocks_target_is_input_shifted_by_one() -> None:
    tokens = torch.arange(100, 123)  # 23 tokens
    blocks = TokenBlocks(tokens, block_size=5)
    assert len(blocks) == (23 - 1) // 5 == 4
    for i in range(len(blocks)):
        x, y = blocks[i]
        assert x.shape == y.shape == (5,)
        assert torch.equal(x, tokens[i * 5 : i * 5 + 5])
        assert torch.equal(y, tokens[i * 5 + 1 : i * 5 + 6])
    # the last block's target may use the final token: n - 1 divisible by the block size
    exact = TokenBlocks(torch.arange(11), block_size=5)
    assert len(exact) == 2
    assert exact[1][1][-1].item() == 10


@pytest.mark.parametrize(("n", "block"), [(0, 4), (4, 4), (9, 16)])
def test_token_blocks_too_few_tokens(n: int, block: int) -> None:
    with pytest.raises(UsageError) as info:
        TokenBlocks(torch.arange(n), block_size=block)
    assert "\n" not in str(info.value) and "smaller max_position_embeddings" in str(info.value)
    TokenBlocks(torch.arange(block + 1), block_size=block)  # one block is enough


def test_build_datasets_splits_one_stream_into_disjoint_parts(
    cache: Path, tmp_path: Path, documents: list[str]
) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text(documents[0], encoding="utf-8")
    lm = build_datasets(corpus=str(path), vocab_size=300, block_size=8)
    expected = [*lm.tokenizer.encode(documents[0]).ids, lm.tokenizer.token_to_id(EOT)]
    train, heldout = lm.train.tokens, lm.heldout.tokens
    # together they are the whole stream, in order, each token exactly once
    assert torch.cat([train, heldout]).tolist() == expected
    assert len(train) + len(heldout) == len(expected)
    assert abs(len(heldout) / len(expected) - 0.1) < 0.01
    assert lm.train.block_size == lm.heldout.block_size == 8
    assert len(lm.train) == (len(train) - 1) // 8


def test_build_datasets_heldout_fraction(cache: Path, tmp_path: Path, documents: list[str]) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text(documents[0], encoding="utf-8")
    lm = build_datasets(corpus=str(path), vocab_size=300, block_size=8, heldout_fraction=0.25)
    total = len(lm.train.tokens) + len(lm.heldout.tokens)
    assert abs(len(lm.heldout.tokens) / total - 0.25) < 0.01


def test_the_encoded_corpus_is_cached_and_keyed_by_text_and_tokenizer(
    cache: Path, documents: list[str]
) -> None:
    tokenizer = train_tokenizer(documents, 300)
    eot = tokenizer.token_to_id(EOT)
    expected = [i for e in tokenizer.encode_batch(documents) for i in [*e.ids, eot]]
    first = encode_corpus(tokenizer, documents)
    (ids,) = (cache / "tokens").iterdir()
    mtime = ids.stat().st_mtime_ns
    again = encode_corpus(tokenizer, documents)
    assert first.dtype == again.dtype == torch.long
    assert first.tolist() == again.tolist() == expected
    assert ids.stat().st_mtime_ns == mtime  # read back, not encoded and written again
    # another text or another tokenizer is another entry, never the stale one
    assert encode_corpus(tokenizer, documents[:1]).tolist() == [
        *tokenizer.encode(documents[0]).ids,
        eot,
    ]
    other = train_tokenizer(documents, 280)
    assert encode_corpus(other, documents).tolist() == [
        i for e in other.encode_batch(documents) for i in [*e.ids, other.token_to_id(EOT)]
    ]
    assert len(list((cache / "tokens").iterdir())) == 3


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "source" / "corpus.txt"
    path.parent.mkdir()
    path.write_text("Some public-domain text.\nÜber alles: naïve.\n", encoding="utf-8")
    return path


def register(monkeypatch: pytest.MonkeyPatch, source: Path, sha256: str) -> None:
    monkeypatch.setitem(data.PUBLIC_CORPORA, "testcorpus", PublicCorpus(source.as_uri(), sha256))


def test_download_with_wrong_checksum_writes_nothing(
    cache: Path, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register(monkeypatch, source, "0" * 64)
    with pytest.raises(UsageError) as info:
        download_corpus("testcorpus")
    message = str(info.value)
    assert "\n" not in message and "SHA-256" in message and "--corpus stdlib" in message
    assert files_under(cache) == []


def test_download_unreachable_url_is_a_usage_error(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register(monkeypatch, tmp_path / "does-not-exist.txt", "0" * 64)
    with pytest.raises(UsageError) as info:
        download_corpus("testcorpus")
    assert "\n" not in str(info.value) and "--corpus stdlib" in str(info.value)
    assert files_under(cache) == []


def test_download_with_matching_checksum_is_cached(
    cache: Path, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payload = source.read_bytes()
    register(monkeypatch, source, hashlib.sha256(payload).hexdigest())
    path = download_corpus("testcorpus")
    assert path.read_bytes() == payload
    assert files_under(cache) == [path]  # no temporary file left beside it
    source.unlink()  # a second call must not read the URL again
    assert download_corpus("testcorpus") == path
    assert load_corpus("testcorpus") == [payload.decode("utf-8")]


def test_failed_cache_write_leaves_no_temporary_file(
    cache: Path, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register(monkeypatch, source, hashlib.sha256(source.read_bytes()).hexdigest())

    def fail(src: object, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(data.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        download_corpus("testcorpus")
    assert files_under(cache) == []
