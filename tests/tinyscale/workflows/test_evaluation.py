"""tinyscale.workflows.evaluation: any layout in, the whole model out; shares that add up.

In-process and small (the "tiny" preset, a few hundred random tokens): the layouts are
written here with the course's own writers for one file and DCP (the scripts' real runs,
ranked and DeepSpeed included, are tests/scripts/test_evaluate.py), the held-out shares
are scored one by one and added as the all-reduce adds them, the sampler is checked
against its definition, and bad input is one line that names the fix.
"""

import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from helpers import one_line_error
from tinyscale.core.checkpoint import save_checkpoint, training_state
from tinyscale.core.config import preset
from tinyscale.core.data import TokenBlocks
from tinyscale.core.model import TinyTransformer
from tinyscale.core.training import TrainConfig, evaluate, make_optimizer
from tinyscale.workflows.evaluation import (
    Checkpoint,
    SampleConfig,
    detect_kind,
    generate,
    heldout_scores,
    model_name,
    read_checkpoint,
    rebuild_model,
    shard_blocks,
    write_report,
)

CFG = preset("tiny")
CPU = torch.device("cpu")
# nats: the shares' sums, added in another order than one process adds them; the page
# (docs/workflows/evaluation.md) states this tolerance, tests/docs/test_prose_evaluation.py
# compares the two
SHARES_TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def model() -> TinyTransformer:
    torch.manual_seed(0)
    return TinyTransformer(CFG).eval()


@pytest.fixture(scope="module")
def blocks() -> TokenBlocks:
    tokens = torch.randint(0, CFG.vocab_size, (1000,), generator=torch.Generator().manual_seed(1))
    return TokenBlocks(tokens, CFG.max_position_embeddings)  # 62 blocks of 16


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[n], sb[n]) for n in sa)


# ---------------------------------------------------------------------------- layouts


def test_single_file_round_trips_with_its_stored_config(model: TinyTransformer, tmp_path: Path):
    state = training_state(model=model, optimizer=make_optimizer(model, TrainConfig()), cfg=None,
                           step=7, epoch=0, device=CPU)  # fmt: skip
    path = save_checkpoint(state, tmp_path / "checkpoints" / "step_000007.pt")
    loaded = read_checkpoint(tmp_path / "checkpoints", config=preset("lab"))  # the newest file
    assert (loaded.path, loaded.kind, loaded.step) == (path, "single", 7)
    assert loaded.model_config == CFG  # stored: the --config given is not used
    assert same_weights(rebuild_model(loaded, preset("lab")), model)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_reads_the_weights_only_and_reties_the_head(model: TinyTransformer, tmp_path: Path):
    """parallel_train's layout: the tied matrix once, Adam's moments beside the weights."""
    state = {n: t for n, t in model.state_dict().items() if n != "lm_head.weight"}
    moments = {f"{n}.exp_avg": torch.ones_like(t) for n, t in state.items()}
    dcp.save({**state, **moments, "step": torch.tensor(5)}, checkpoint_id=tmp_path, no_dist=True)
    assert detect_kind(tmp_path) == "dcp"
    loaded = read_checkpoint(tmp_path, config=CFG)
    assert (loaded.step, loaded.model_config) == (5, None) and set(loaded.weights) == set(state)
    rebuilt = rebuild_model(loaded, CFG)
    assert same_weights(rebuilt, model)
    assert rebuilt.lm_head.weight.data_ptr() == rebuilt.tok_emb.weight.data_ptr()  # still tied
    message = one_line_error(read_checkpoint, tmp_path, config=preset("tiny", hidden_size=64))
    assert message == (
        f"{tmp_path} has tok_emb.weight of shape (260, 32), the config gives (260, 64): "
        "another model shape; pass the --config it was trained with"
    )


def test_pipeline_stage_names_become_the_model_names() -> None:
    assert model_name("0.blocks.1.ln_1.weight") == "blocks.1.ln_1.weight"
    assert model_name("1.lm_head.weight") == "lm_head.weight"
    assert model_name("tok_emb.weight") == "tok_emb.weight"


def test_missing_tensor_and_unknown_layouts_are_one_line(model: TinyTransformer, tmp_path: Path):
    weights = {n: t for n, t in model.state_dict().items() if not n.startswith("ln_f")}
    checkpoint = Checkpoint(path=tmp_path, kind="dcp", step=None, weights=weights,
                            model_config=None)  # fmt: skip
    assert one_line_error(rebuild_model, checkpoint, CFG) == (
        f"{tmp_path} has no tensor ln_f.weight: not this model's checkpoint; pass the --config "
        "it was trained with"
    )
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert "holds no checkpoint layout the course writes" in one_line_error(detect_kind, tmp_path)
    assert one_line_error(detect_kind, tmp_path / "gone") == (
        f"checkpoint {tmp_path / 'gone'} not found: check the path"
    )
    torch.save({"weights": 1}, tmp_path / "other.pt")  # a file, but not the course's
    message = one_line_error(read_checkpoint, tmp_path / "other.pt", config=CFG)
    assert "is not a tinyscale checkpoint (no 'tinyscale.checkpoint.v1' marker)" in message


# ---------------------------------------------------------------------------- scores


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_shards_cover_every_block_once_in_order(blocks: TokenBlocks, world: int) -> None:
    shards = [shard_blocks(blocks, r, world) for r in range(world)]
    assert [len(s) for s in shards] == [len(range(62 * r // world, 62 * (r + 1) // world))
                                        for r in range(world)]  # fmt: skip
    xs = [s[i][0] for s in shards for i in range(len(s))]
    ys = [s[i][1] for s in shards for i in range(len(s))]
    assert all(torch.equal(x, blocks[i][0]) and torch.equal(y, blocks[i][1])
               for i, (x, y) in enumerate(zip(xs, ys, strict=True)))  # fmt: skip


def test_shares_add_up_to_one_process(model: TinyTransformer, blocks: TokenBlocks) -> None:
    """What heldout_scores all-reduces (loss x blocks, blocks), summed here share by share."""
    one = heldout_scores(model, blocks, batch_size=16, device=CPU)  # no process group: 1 rank
    assert one["loss"] == evaluate(model, blocks, batch_size=16, device=CPU)["loss"]
    assert (one["blocks"], one["tokens"], one["ranks"]) == (62, 62 * 16, 1)
    shares = [shard_blocks(blocks, r, 3) for r in range(3)]
    sums = [evaluate(model, s, batch_size=16, device=CPU)["loss"] * len(s) for s in shares]
    assert sum(sums) / 62 == pytest.approx(one["loss"], abs=SHARES_TOLERANCE)
    assert one["perplexity"] == pytest.approx(math.exp(one["loss"]), rel=1e-12)
    assert one_line_error(shard_blocks, blocks, 0, 63) == (
        "63 ranks for 62 held-out blocks: launch at most 62"
    )


# ---------------------------------------------------------------------------- sample


def test_greedy_and_top1_pick_the_most_likely_token(model: TinyTransformer) -> None:
    prompt = [5, 6, 7]
    greedy = generate(model, prompt, SampleConfig(temperature=0, max_new_tokens=20), device=CPU)
    top1 = generate(model, prompt, SampleConfig(top_k=1, max_new_tokens=20, seed=3), device=CPU)
    ids = prompt + greedy
    with torch.no_grad():
        for t in range(len(prompt), len(ids)):  # each token: the argmax after its last window
            window = torch.tensor([ids[max(0, t - CFG.max_position_embeddings) : t]])
            assert model(window)[0][0, -1].argmax().item() == ids[t]
    assert greedy == top1 and len(greedy) == 20  # 20 > 16 positions: the window slid


def test_sampling_is_seeded_and_stays_in_the_top_k(model: TinyTransformer) -> None:
    cfg = SampleConfig(temperature=1.5, top_k=3, max_new_tokens=30)
    first = generate(model, [1], cfg, device=CPU)
    torch.manual_seed(123)  # the global generator does not matter: the sampler has its own
    assert generate(model, [1], cfg, device=CPU) == first
    assert generate(model, [1], SampleConfig(temperature=1.5, top_k=3, max_new_tokens=30,
                                             seed=1), device=CPU) != first  # fmt: skip
    ids = [1, *first]
    with torch.no_grad():
        for t in range(1, len(ids)):
            window = torch.tensor([ids[max(0, t - CFG.max_position_embeddings) : t]])
            assert ids[t] in model(window)[0][0, -1].topk(3).indices.tolist()


def test_bad_sample_settings_are_one_line(model: TinyTransformer) -> None:
    assert one_line_error(SampleConfig, top_k=-1).startswith(
        "need --max-new-tokens >= 0, --top-k >= 0 and --temperature >= 0 (got 40, -1, 0.8)"
    )
    assert "--temperature >= 0" in one_line_error(SampleConfig, temperature=float("nan"))
    assert one_line_error(generate, model, [], SampleConfig(), device=CPU) == (
        "the prompt encodes to no tokens: pass a non-empty --prompt"
    )


# ---------------------------------------------------------------------------- report


def test_report_is_written_atomically(tmp_path: Path) -> None:
    path = write_report({"loss": 1.5}, tmp_path / "eval" / "report.json")
    assert json.loads(path.read_text()) == {"loss": 1.5}
    with pytest.raises(TypeError):  # fails mid-way: the old report stays, no temp file
        write_report({"loss": object()}, path)
    assert json.loads(path.read_text()) == {"loss": 1.5}
    assert os.listdir(path.parent) == ["report.json"]
