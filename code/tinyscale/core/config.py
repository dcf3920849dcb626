# --8<-- [start:model_config]
"""The model's shape, read from ``code/config/config.json`` and checked before anything runs.

Try it:  python -c "from tinyscale.core.config import load_model_config as f; print(f('code/config/config.json'))"
"""

import dataclasses
import difflib
import json
import math
from pathlib import Path

from tinyscale.core.errors import UsageError

DEFAULT_CONFIG_PATH = Path("code/config/config.json")
REPO_ROOT = Path(__file__).resolve().parents[3]  # code/tinyscale/core/config.py -> the repo


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Hyper-parameters of TinyTransformer, named as Hugging Face names them."""

    hidden_size: int = 64  # width of every token vector (the embedding size)
    num_hidden_layers: int = 2  # transformer blocks stacked
    num_attention_heads: int = 4  # heads per attention layer; must divide hidden_size
    intermediate_size: int = 256  # width of the feed-forward (FFN) layer, usually 4x hidden
    vocab_size: int = 1024  # tokens the tokenizer may produce
    max_position_embeddings: int = 64  # longest sequence the model accepts (the block size)
    dropout: float = 0.1
    layer_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True  # lm_head reuses tok_emb's matrix (see TinyTransformer)

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type is bool:
                if not isinstance(value, bool):
                    raise UsageError(f"{field.name} must be true or false, got {value!r}")
                continue
            if field.type is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise UsageError(f"{field.name} must be a whole number, got {value!r}")
            if field.type is float and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise UsageError(f"{field.name} must be a finite number, got {value!r}")
            if field.name != "dropout" and value <= 0:
                raise UsageError(f"{field.name} must be positive, got {value}")
        if not 0 <= self.dropout < 1:
            raise UsageError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.hidden_size % self.num_attention_heads:
            raise UsageError(
                f"hidden_size ({self.hidden_size}) is not divisible by num_attention_heads "
                f"({self.num_attention_heads}): pick a head count that divides it, "
                f"e.g. {_divisors_near(self.hidden_size, self.num_attention_heads)}"
            )
        if self.vocab_size < 260:
            raise UsageError(
                f"vocab_size must be at least 260 (256 bytes plus merges), got {self.vocab_size}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def _divisors_near(n: int, k: int) -> str:
    divisors = sorted((d for d in range(1, n + 1) if n % d == 0), key=lambda d: abs(d - k))
    return " or ".join(str(d) for d in sorted(divisors[:2]))


# --8<-- [end:model_config]


# --8<-- [start:presets]
# Named shapes: a test, a benchmark or a lesson that means "the tiny model" says so instead
# of writing its numbers again. "lab" is code/config/config.json, the model the labs train.
PRESETS: dict[str, ModelConfig] = {
    # 170 k parameters: Lab 1 trains it for two epochs in under a minute on a laptop
    "lab": ModelConfig(),
    # 26 k parameters, no dropout: parity tests of N ranks against one, seconds each
    "tiny": ModelConfig(hidden_size=32, intermediate_size=64, vocab_size=260,
                        max_position_embeddings=16, dropout=0.0),
    # 6.5 k parameters: checkpoint demos, whose files are small enough to read byte by byte
    "micro": ModelConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, vocab_size=260, max_position_embeddings=8),
    # 4.2 M parameters: benchmarks, where the matmuls, not Python, should take the time
    "bench": ModelConfig(hidden_size=256, num_hidden_layers=4, intermediate_size=1024,
                         vocab_size=4096, dropout=0.0),
    # 6.6 B parameters: the Week 4 planner's worked example, counted on paper (build one on
    # the "meta" device to inspect it)
    "7b": ModelConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                      intermediate_size=16384, vocab_size=32000, max_position_embeddings=8192,
                      dropout=0.0),
}  # fmt: skip
# 64.8 B parameters: the same family at scale, twice as wide and 2.5 times as deep
PRESETS["70b"] = dataclasses.replace(PRESETS["7b"], hidden_size=8192, num_hidden_layers=80,
                                     num_attention_heads=64, intermediate_size=32768)  # fmt: skip


def preset(name: str, **changes: object) -> ModelConfig:
    """A named shape, with any field changed: ``preset("tiny", num_hidden_layers=6)``."""
    if name not in PRESETS:
        raise UsageError(f"unknown model preset {name!r}: use one of {', '.join(PRESETS)}")
    return dataclasses.replace(PRESETS[name], **changes)


# --8<-- [end:presets]


# --8<-- [start:load_model_config]
def find_file(path: str | Path) -> Path:
    """``path`` as given; if it is relative and not found from here, from the repository root.

    So the default code/config/config.json is found when a lab is started from any folder.
    """
    path = Path(path)
    if not path.exists() and not path.is_absolute() and (REPO_ROOT / path).exists():
        return REPO_ROOT / path
    return path


def read_json_object(path: str | Path, *, missing: str, invalid_fix: str) -> dict:
    """A JSON file that must hold an object {...}; `missing` and `invalid_fix` name the fix."""
    path = find_file(path)
    if not path.is_file():
        raise UsageError(missing)
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise UsageError(
            f"{path} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}): "
            f"{invalid_fix}"
        ) from None
    if not isinstance(raw, dict):
        raise UsageError(f"{path} must hold a JSON object {{...}}, not {type(raw).__name__}")
    return raw


def load_model_config(path: str | Path = DEFAULT_CONFIG_PATH) -> ModelConfig:
    """Read a JSON config; every mistake becomes a one-line UsageError that names the fix."""
    path = Path(path)
    raw = read_json_object(
        path,
        missing=f"config file {path} not found: pass --config with the path of a JSON file "
        f"like {DEFAULT_CONFIG_PATH}",
        invalid_fix="fix the syntax, e.g. remove a trailing comma",
    )
    known = [f.name for f in dataclasses.fields(ModelConfig)]
    for key in raw:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(known)}"
            raise UsageError(f"unknown key '{key}' in {path}: {hint}")
    return ModelConfig(**raw)


# --8<-- [end:load_model_config]
