# --8<-- [start:corpus]
"""The text we train on, the tokenizer we train on it, and fixed-length blocks of tokens.

Try it:  python -c "from tinyscale.core.data import load_corpus; print(len(load_corpus()), 'characters')"

The default corpus is real text that every Python installation already has: a fixed
list of standard-library source files, read from the running interpreter. Nothing is
downloaded, so every test and every reader sees the same kind of data offline.
"""

import hashlib
import io
import os
import sysconfig
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tinyscale.core.errors import UsageError

# Files present in every CPython 3.11+; the last ones become the held-out set.
STDLIB_FILES = (
    "textwrap.py",
    "string.py",
    "heapq.py",
    "bisect.py",
    "functools.py",
    "dataclasses.py",
    "enum.py",
    "random.py",
    "statistics.py",
    "fractions.py",
    "shutil.py",
    "difflib.py",
    "pprint.py",
    "csv.py",
    "calendar.py",
    "queue.py",
    "contextlib.py",
    "copy.py",
    "glob.py",
    "fnmatch.py",
    "tempfile.py",
    "json/decoder.py",
    "json/encoder.py",
)


def stdlib_corpus_paths() -> list[Path]:
    """Paths of the corpus files in this interpreter's standard library."""
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = [root / name for name in STDLIB_FILES]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise UsageError(
            f"standard-library sources not found ({missing[0]}): use a CPython that ships "
            "its .py files, or pass --corpus PATH to a text file"
        )
    return paths


def load_corpus(corpus: str = "stdlib") -> list[str]:
    """The documents of a corpus: 'stdlib', 'tinyshakespeare' (downloaded once), or a path."""
    if corpus == "stdlib":
        return [p.read_text(encoding="utf-8") for p in stdlib_corpus_paths()]
    if corpus in PUBLIC_CORPORA:
        return [download_corpus(corpus).read_text(encoding="utf-8")]
    path = Path(corpus)
    if not path.is_file():
        raise UsageError(
            f"corpus '{corpus}' is neither a known name ({', '.join(['stdlib', *PUBLIC_CORPORA])}) "
            "nor a text file: check the path"
        )
    return [path.read_text(encoding="utf-8")]


# --8<-- [end:corpus]


# --8<-- [start:download]
@dataclass(frozen=True)
class PublicCorpus:
    url: str
    sha256: str


# An optional, bigger corpus for readers with internet. Never used by the tests.
PUBLIC_CORPORA = {
    "tinyshakespeare": PublicCorpus(
        url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
    )
}


def cache_dir() -> Path:
    """Where downloads, trained tokenizers and encoded corpora are kept: $TINYSCALE_CACHE or
    ~/.cache/tinyscale."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tinyscale"
    return Path(os.environ.get("TINYSCALE_CACHE", default))


def download_corpus(name: str, *, url: str | None = None) -> Path:
    """Download a public corpus once into the cache, verify its SHA-256, and return its path."""
    spec = PUBLIC_CORPORA[name]
    dest = cache_dir() / "corpora" / f"{name}.txt"
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url or spec.url, timeout=30) as response:
            payload = response.read()
    except OSError as err:
        raise UsageError(
            f"could not download corpus '{name}' ({err}): connect to the internet "
            "or use the offline default --corpus stdlib"
        ) from None
    digest = hashlib.sha256(payload).hexdigest()
    if digest != spec.sha256:
        raise UsageError(
            f"corpus '{name}' has SHA-256 {digest[:12]}..., expected {spec.sha256[:12]}...: "
            "the file changed upstream; use --corpus stdlib or a local file"
        )
    write_atomic(dest, payload)  # never a half-written file in the cache
    return dest


def write_atomic(dest: Path, payload: bytes) -> None:
    """Write to a temp file beside ``dest``, then rename: a reader sees all or nothing."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)  # only still there if the write or rename failed


# --8<-- [end:download]


# --8<-- [start:tokenizer]
def train_tokenizer(documents: list[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE tokenizer: start from the 256 bytes, merge frequent pairs.

    Byte-level means any text, in any language, encodes without unknown tokens.
    The result is cached by (vocab_size, corpus hash): training twice gives the same file.
    """
    digest = hashlib.sha256("\0".join(documents).encode()).hexdigest()[:16]
    path = cache_dir() / "tokenizers" / f"bpe-{vocab_size}-{digest}.json"
    if path.is_file():
        return Tokenizer.from_file(str(path))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer=trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, tokenizer.to_str().encode())
    return tokenizer


EOT = "<|endoftext|>"  # separates documents in the token stream


# --8<-- [end:tokenizer]


# --8<-- [start:blocks]
class TokenBlocks(torch.utils.data.Dataset):
    """Cut a token stream into fixed-length blocks; the target is the input shifted by one.

    tokens: a b c d e f g   block_size 3 ->  x = [a b c], y = [b c d];  x = [d e f], y = [e f g]
    """

    def __init__(self, tokens: torch.Tensor, block_size: int) -> None:
        if len(tokens) < block_size + 1:
            raise UsageError(
                f"only {len(tokens)} tokens for blocks of {block_size}: use a bigger corpus "
                "or a smaller max_position_embeddings"
            )
        self.tokens = tokens
        self.block_size = block_size

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.block_size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.block_size
        chunk = self.tokens[start : start + self.block_size + 1]
        return chunk[:-1], chunk[1:]


# --8<-- [end:blocks]


# --8<-- [start:datasets]
@dataclass(frozen=True, kw_only=True)
class LMData:
    tokenizer: Tokenizer
    train: TokenBlocks
    heldout: TokenBlocks


def build_datasets(
    *, corpus: str = "stdlib", vocab_size: int, block_size: int, heldout_fraction: float = 0.1
) -> LMData:
    """Tokenize the corpus and split the token stream: the first 90 % trains, the rest is held out.

    Held-out tokens are never trained on, so their loss tells whether the model
    generalises or only memorises.
    """
    documents = load_corpus(corpus)
    tokenizer = train_tokenizer(documents, vocab_size)
    tokens = encode_corpus(tokenizer, documents)
    split = int(len(tokens) * (1 - heldout_fraction))
    return LMData(
        tokenizer=tokenizer,
        train=TokenBlocks(tokens[:split], block_size),
        heldout=TokenBlocks(tokens[split:], block_size),
    )


def encode_corpus(tokenizer: Tokenizer, documents: list[str]) -> torch.Tensor:
    """The corpus as one stream of token ids, each document followed by EOT.

    Encoding costs more than anything else a short run does before its first step (half a
    second of CPU for our corpus, in every rank of every launch), so the ids are cached
    like the tokenizer, under a hash of the text and the tokenizer: change either and the
    corpus is encoded again.
    """
    key = hashlib.sha256("\0".join([*documents, tokenizer.to_str()]).encode()).hexdigest()[:16]
    path = cache_dir() / "tokens" / f"ids-{key}.pt"
    if path.is_file():
        return torch.load(path, weights_only=True).long()
    eot = tokenizer.token_to_id(EOT)
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(documents):
        ids.extend(encoding.ids)
        ids.append(eot)
    tokens = torch.tensor(ids, dtype=torch.long)
    buffer = io.BytesIO()
    torch.save(tokens.to(torch.int32), buffer)  # half the bytes; any vocabulary fits
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, buffer.getvalue())
    return tokens


# --8<-- [end:datasets]


# --8<-- [start:batches]
def epoch_batches(
    num_samples: int, batch_size: int, *, seed: int, epoch: int
) -> list[torch.Tensor]:
    """This epoch's batches of sample indices: a fresh shuffle per epoch, reproducible from
    (seed, epoch) alone, so a resumed run can skip to batch k of epoch e. Drops the last
    incomplete batch, so every step sees the same number of tokens."""
    generator = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(num_samples, generator=generator)
    usable = num_samples - num_samples % batch_size
    return list(order[:usable].split(batch_size)) if usable else []


def get_batch(
    dataset: TokenBlocks, indices: torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack the blocks at ``indices`` into one batch on ``device``."""
    pairs = [dataset[i] for i in indices.tolist()]
    x = torch.stack([p[0] for p in pairs]).to(device)  # (B, T) input token ids
    y = torch.stack([p[1] for p in pairs]).to(device)  # (B, T) the next token at each position
    return x, y


# --8<-- [end:batches]
