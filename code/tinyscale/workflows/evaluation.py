# --8<-- [start:header]
"""Evaluate any course checkpoint: held-out loss, perplexity and a sample, whoever trained it.

Try it:  python code/scripts/evaluate.py runs/lab1/checkpoints --prompt "def "

The course writes four checkpoint layouts: Lab 1's single file, ranked directories (one
file per rank and a manifest), DCP directories (shards and .metadata) and DeepSpeed's
folders (ZeRO shards). ``read_checkpoint`` tells them apart by their files and returns
the whole model's weights under TinyTransformer's names; ``heldout_scores`` scores them
on the held-out blocks, split over the ranks when torchrun started several.
"""

import contextlib
import dataclasses
import io
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tinyscale.core.checkpoint import (
    MANIFEST,
    latest_checkpoint,
    load_checkpoint,
    verify_checkpoint,
)
from tinyscale.core.cli import option
from tinyscale.core.config import ModelConfig
from tinyscale.core.data import TokenBlocks
from tinyscale.core.errors import UsageError
from tinyscale.core.model import TinyTransformer
from tinyscale.core.training import evaluate
from tinyscale.data_parallel.ranked_checkpoint import load_ranked, read_manifest

KINDS = {
    "single": "one file (Lab 1's save_checkpoint)",
    "ranked": "a file per rank + manifest.json (save_ranked)",
    "dcp": "DCP shards + .metadata (torch.distributed.checkpoint)",
    "deepspeed": "DeepSpeed ZeRO shards (engine.save_checkpoint)",
}
DEEPSPEED_SIDECAR = "tinyscale.json"  # what code/scripts/deepspeed_train.py writes beside them
FIX = "evaluate an earlier checkpoint, or pass its run's checkpoints folder (the newest whole one)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """A checkpoint as the evaluation needs it, whatever its layout."""

    path: Path
    kind: str  # a key of KINDS
    step: int | None  # None: the files do not say
    weights: dict[str, torch.Tensor]  # the whole model's, under TinyTransformer's names
    model_config: ModelConfig | None  # None: not stored; the caller's --config applies


# --8<-- [end:header]


# --8<-- [start:detect]
def detect_kind(path: Path) -> str:
    """Which writer made ``path``, from the files it holds: nothing else is trusted."""
    if path.is_file():
        return "single"  # load_checkpoint then checks the course's format marker
    if (path / ".metadata").is_file():  # first: the course's DCP saves have a manifest too
        return "dcp"
    if (path / MANIFEST).is_file():
        return "ranked"
    if any(path.glob("*model_states.pt")):
        return "deepspeed"
    if not path.exists():
        raise UsageError(f"checkpoint {path} not found: check the path")
    raise UsageError(
        f"{path} holds no checkpoint layout the course writes (a step_*.pt file, or a folder "
        f"with {MANIFEST}, .metadata or *model_states.pt): pass one step's file or folder"
    )


def resolve(path: str | Path) -> Path:
    """A run's checkpoints folder stands for its newest complete checkpoint."""
    path = Path(path)
    latest = path / "latest"  # DeepSpeed's pointer, written after its folder is complete
    if latest.is_file():
        return path / latest.read_text().strip()
    if path.is_dir() and not any((path / n).exists() for n in (MANIFEST, ".metadata")):
        return latest_checkpoint(path) or path
    return path


# --8<-- [end:detect]


# --8<-- [start:readers]
def read_checkpoint(path: str | Path, *, config: ModelConfig) -> Checkpoint:
    """The whole model's weights from any course checkpoint; ``config`` if none is stored."""
    path = resolve(path)
    kind = detect_kind(path)
    if kind == "single" or (path / MANIFEST).is_file():  # whole? the sizes, before reading
        verify_checkpoint(path, fix=FIX)
    if kind == "single":
        state = load_checkpoint(path, fix=FIX)  # refuses a file without the course's marker
        return Checkpoint(path=path, kind=kind, step=state["step"], weights=state["model"],
                          model_config=stored_config(state))  # fmt: skip
    if kind == "ranked":
        manifest = read_manifest(path)
        weights, world = {}, manifest["world_size"]
        for rank in range(world):  # every rank's file, each checked against the manifest
            state = load_ranked(path, rank=rank, world_size=world, fix=FIX)
            for name, tensor in state["model"].items():  # stage-local names -> the model's
                weights[model_name(name)] = tensor
        return Checkpoint(path=path, kind=kind, step=manifest["step"], weights=weights,
                          model_config=stored_config(state))  # fmt: skip
    if kind == "dcp":
        return read_dcp(path, config)
    return read_deepspeed(path)


def model_name(name: str) -> str:
    """A pipeline rank saves its stages as a list, '0.blocks.1.ln_1.weight': drop the index."""
    first, _, rest = name.partition(".")
    return rest if first.isdigit() else name


def stored_config(state: dict[str, Any]) -> ModelConfig | None:
    saved = state.get("model_config")
    return ModelConfig(**{**dataclasses.asdict(ModelConfig()), **saved}) if saved else None


def read_dcp(path: Path, config: ModelConfig) -> Checkpoint:
    """Load the model's tensors only (not Adam's moments) into a template, on one process."""
    import torch.distributed.checkpoint as dcp

    expected = model_shapes(config)
    if config.tie_word_embeddings:  # saved once, under the embedding's name
        expected.pop("lm_head.weight")
    template: dict[str, Any] = {name: torch.empty(shape) for name, shape in expected.items()}
    try:  # one written elsewhere may have no manifest: what DCP cannot read is one line
        saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        check_shapes({n: tuple(m.size) for n, m in saved.items() if hasattr(m, "size")},
                     expected, path=path, fix="pass the --config it was trained with")  # fmt: skip
        if "step" in saved:
            template["step"] = torch.tensor(0)
        with warnings.catch_warnings():  # "assuming ... a single process": yes, on purpose
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(template, checkpoint_id=path, no_dist=True)  # only the template's keys
    except UsageError:
        raise
    except (Exception, dcp.api.CheckpointException) as err:  # DCP's is a BaseException
        raise UsageError(f"{path} is damaged: DCP cannot read it ({type(err).__name__}); "
                         f"{FIX}") from None  # fmt: skip
    step = int(template.pop("step")) if "step" in saved else None
    return Checkpoint(path=path, kind="dcp", step=step, weights=template, model_config=None)


def read_deepspeed(path: Path) -> Checkpoint:
    """DeepSpeed's own tool gathers the fp32 weights from every ZeRO shard, on the CPU."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with contextlib.redirect_stdout(io.StringIO()):  # its progress lines: not our output
        weights = get_fp32_state_dict_from_zero_checkpoint(str(path.parent), tag=path.name)
    sidecar = path / DEEPSPEED_SIDECAR
    step = json.loads(sidecar.read_text())["step"] if sidecar.is_file() else None
    return Checkpoint(path=path, kind="deepspeed", step=step, weights=dict(weights),
                      model_config=None)  # fmt: skip


# --8<-- [end:readers]


# --8<-- [start:rebuild]
def model_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor TinyTransformer(config) holds, and its shape: built on the meta device,
    so no memory is allocated and nothing is initialised."""
    with torch.device("meta"):
        model = TinyTransformer(config)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def check_shapes(
    found: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]], *, path: Path,
    fix: str,
) -> None:  # fmt: skip
    """One line naming the first tensor that is missing or has another shape."""
    for name, shape in expected.items():
        if name not in found:
            raise UsageError(f"{path} has no tensor {name}: not this model's checkpoint; {fix}")
        if found[name] != shape:
            raise UsageError(
                f"{path} has {name} of shape {found[name]}, the config gives {shape}: "
                f"another model shape; {fix}"
            )


def rebuild_model(checkpoint: Checkpoint, config: ModelConfig) -> TinyTransformer:
    """TinyTransformer with the checkpoint's weights, in eval mode (no dropout)."""
    config = checkpoint.model_config or config
    weights = dict(checkpoint.weights)
    if config.tie_word_embeddings and "tok_emb.weight" in weights:
        weights.setdefault("lm_head.weight", weights["tok_emb.weight"])  # one matrix, two names
    expected = model_shapes(config)
    fix = (
        "the config stored in it is wrong"
        if checkpoint.model_config
        else "pass the --config it was trained with"
    )
    check_shapes({n: tuple(t.shape) for n, t in weights.items()}, expected, path=checkpoint.path,
                 fix=fix)  # fmt: skip
    model = TinyTransformer(config)
    model.load_state_dict({name: weights[name].float() for name in expected})
    return model.eval()


# --8<-- [end:rebuild]


# --8<-- [start:scores]
def shard_blocks(dataset: TokenBlocks, rank: int, world_size: int) -> TokenBlocks:
    """Rank r's contiguous share of the blocks: [n r / N, n (r + 1) / N)."""
    n, size = len(dataset), dataset.block_size
    if world_size > n:
        raise UsageError(f"{world_size} ranks for {n} held-out blocks: launch at most {n}")
    start, stop = n * rank // world_size, n * (rank + 1) // world_size
    return TokenBlocks(dataset.tokens[start * size : stop * size + 1], size)  # + 1: last target


def heldout_scores(
    model: TinyTransformer, dataset: TokenBlocks, *, batch_size: int, device: torch.device
) -> dict[str, float]:
    """Mean loss over every held-out block; each rank scores its share, the sums are added.

    Lab 1's ``evaluate`` scores a share; the loss times the blocks is the share's sum, and
    two sums (loss, blocks) all-reduced in float64 give the mean of one process.
    """
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    mine = shard_blocks(dataset, rank, world)
    scores = evaluate(model, mine, batch_size=batch_size, device=device)
    sums = torch.tensor([scores["loss"] * len(mine), len(mine)], dtype=torch.float64, device=device)
    if world > 1:
        dist.all_reduce(sums)  # SUM over the ranks: every rank gets the totals
    loss, blocks = sums[0].item() / sums[1].item(), int(sums[1].item())
    return {"loss": loss, "perplexity": math.exp(loss), "blocks": blocks,
            "tokens": blocks * dataset.block_size, "ranks": world}  # fmt: skip


# --8<-- [end:scores]


# --8<-- [start:sample]
@dataclasses.dataclass(frozen=True, kw_only=True)
class SampleConfig:
    """How to draw the sample; each field is a flag of code/scripts/evaluate.py."""

    prompt: str = option("def ", "the text the sample continues")
    max_new_tokens: int = option(40, "tokens to generate")
    temperature: float = option(0.8, "divides the logits; 0 picks the most likely token")
    top_k: int = option(20, "sample among the k most likely tokens; 0: all of them")
    seed: int = option(0, "the same seed draws the same sample")

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0 or self.top_k < 0 or not self.temperature >= 0:
            raise UsageError(
                "need --max-new-tokens >= 0, --top-k >= 0 and --temperature >= 0 "
                f"(got {self.max_new_tokens}, {self.top_k}, {self.temperature})"
            )


@torch.no_grad()
def generate(
    model: TinyTransformer, prompt_ids: list[int], cfg: SampleConfig, *, device: torch.device
) -> list[int]:
    """Append cfg.max_new_tokens tokens, one at a time, each drawn from the model's scores."""
    if not prompt_ids:
        raise UsageError("the prompt encodes to no tokens: pass a non-empty --prompt")
    generator = torch.Generator(device=device).manual_seed(cfg.seed)  # ours alone: reproducible
    ids = torch.tensor([prompt_ids], device=device)  # (1, T)
    for _ in range(cfg.max_new_tokens):
        logits, _ = model(ids[:, -model.cfg.max_position_embeddings :])  # the last window
        scores = logits[0, -1]  # (vocab,) the next token's
        if cfg.temperature == 0:
            token = scores.argmax().view(1)
        else:
            scores = scores / cfg.temperature  # < 1 sharpens, > 1 flattens
            if cfg.top_k:
                kth = torch.topk(scores, min(cfg.top_k, scores.numel())).values[-1]
                scores = scores.masked_fill(scores < kth, -math.inf)
            token = torch.multinomial(scores.softmax(-1), 1, generator=generator)
        ids = torch.cat([ids, token.view(1, 1)], dim=1)
    return ids[0, len(prompt_ids) :].tolist()


# --8<-- [end:sample]


# --8<-- [start:report]
def write_report(report: dict[str, Any], path: str | Path) -> Path:
    """The report as JSON, atomically: a reader sees the old file or the new, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


# --8<-- [end:report]
