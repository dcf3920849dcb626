"""tinyscale.core.model: shapes, the untrained loss, causality, weight tying, the parameter formula,
and the cuts Weeks 3-4 make (pipeline stages, attention heads split across ranks).

``count_parameters`` is the paper formula the course teaches; here it is compared with the
parameters a built model really has, for several shapes.
"""

import dataclasses
import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from tinyscale.core.config import ModelConfig, preset
from tinyscale.core.errors import UsageError
from tinyscale.core.model import (
    CausalSelfAttention,
    ModelStage,
    TinyTransformer,
    count_parameters,
    cut_into_stages,
    head_channels,
    qkv_rows,
)

SMALL = preset("tiny", vocab_size=300, dropout=0.1)  # with dropout, and not a power of two


def make_model(cfg: ModelConfig = SMALL, seed: int = 0) -> TinyTransformer:
    torch.manual_seed(seed)
    return TinyTransformer(cfg)


def test_output_shapes() -> None:
    model = make_model()
    x = torch.randint(0, SMALL.vocab_size, (3, 10))
    logits, loss = model(x)
    assert logits.shape == (3, 10, SMALL.vocab_size)
    assert loss is None
    logits, loss = model(x, x)
    assert logits.shape == (3, 10, SMALL.vocab_size)
    assert loss is not None and loss.shape == ()


def test_default_config_builds() -> None:
    model = TinyTransformer()
    assert model.cfg == ModelConfig()
    assert model.num_parameters() == count_parameters(ModelConfig())


@pytest.mark.parametrize("vocab_size", [300, 1024])
def test_untrained_loss_is_about_ln_vocab(vocab_size: int) -> None:
    cfg = ModelConfig(vocab_size=vocab_size, max_position_embeddings=32)
    model = make_model(cfg).eval()
    generator = torch.Generator().manual_seed(1)
    x = torch.randint(0, vocab_size, (8, 32), generator=generator)
    y = torch.randint(0, vocab_size, (8, 32), generator=generator)
    with torch.no_grad():
        _, loss = model(x, y)
    assert loss is not None
    assert abs(loss.item() - math.log(vocab_size)) < 0.5


def test_causality_future_tokens_do_not_change_past_logits() -> None:
    model = make_model().eval()
    T, t = SMALL.max_position_embeddings, 6
    generator = torch.Generator().manual_seed(2)
    x = torch.randint(0, SMALL.vocab_size, (2, T), generator=generator)
    changed = x.clone()
    changed[:, t + 1 :] = torch.randint(0, SMALL.vocab_size, (2, T - t - 1), generator=generator)
    assert not torch.equal(x[:, t + 1 :], changed[:, t + 1 :])
    with torch.no_grad():
        a, _ = model(x)
        b, _ = model(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=1e-6)
    # and the positions after t did see the change (the test can tell the difference)
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])


def test_weight_tying() -> None:
    model = make_model()
    assert model.lm_head.weight is model.tok_emb.weight
    names = [name for name, _ in model.named_parameters()]
    assert "lm_head.weight" not in names  # counted once
    # a gradient through the head lands on the embedding matrix
    _, loss = model(torch.randint(0, SMALL.vocab_size, (1, 4)), torch.zeros(1, 4, dtype=torch.long))
    assert loss is not None
    loss.backward()
    assert model.tok_emb.weight.grad is not None


def test_untied_head_has_its_own_weight() -> None:
    untied = dataclasses.replace(SMALL, tie_word_embeddings=False)
    model = make_model(untied)
    assert model.lm_head.weight is not model.tok_emb.weight
    assert "lm_head.weight" in dict(model.named_parameters())
    h, V = SMALL.hidden_size, SMALL.vocab_size
    assert model.num_parameters() == make_model().num_parameters() + V * h
    # initialised like the others (normal, std 0.02), not with nn.Linear's default (std ~0.1)
    assert abs(model.lm_head.weight.std().item() - 0.02) < 0.002
    _, loss = model(torch.randint(0, V, (1, 4)), torch.zeros(1, 4, dtype=torch.long))
    assert loss is not None
    loss.backward()
    assert model.lm_head.weight.grad is not None and model.tok_emb.weight.grad is not None
    assert not torch.equal(model.lm_head.weight.grad, model.tok_emb.weight.grad)


@pytest.mark.parametrize(
    "cfg",
    [
        ModelConfig(),
        ModelConfig(num_hidden_layers=1),
        ModelConfig(num_hidden_layers=5, num_attention_heads=8),
        ModelConfig(hidden_size=48, num_attention_heads=3, intermediate_size=100),
        ModelConfig(hidden_size=128, num_attention_heads=2, intermediate_size=512),
        ModelConfig(vocab_size=2000, max_position_embeddings=128, intermediate_size=7),
    ],
    ids=["default", "1-layer", "5-layers-8-heads", "48-wide", "128-wide", "big-vocab"],
)
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_count_parameters_formula_matches_the_model(cfg: ModelConfig, tie: bool) -> None:
    cfg = dataclasses.replace(cfg, tie_word_embeddings=tie)
    model = TinyTransformer(cfg)
    by_hand = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert model.num_parameters() == by_hand
    assert count_parameters(cfg) == model.num_parameters()


def test_sequence_longer_than_max_positions_is_refused() -> None:
    model = make_model()
    too_long = torch.zeros(1, SMALL.max_position_embeddings + 1, dtype=torch.long)
    with pytest.raises(ValueError, match="max_position_embeddings") as info:
        model(too_long)
    message = str(info.value)
    assert "\n" not in message and "shorter" in message  # names the fix
    model(too_long[:, :-1])  # exactly max_position_embeddings is fine


def test_same_seed_same_init_different_seed_different_init() -> None:
    a, b, c = make_model(seed=3), make_model(seed=3), make_model(seed=4)
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.tok_emb.weight, c.tok_emb.weight)


def test_dropout_is_off_in_eval_mode() -> None:
    model = make_model(dataclasses.replace(SMALL, dropout=0.5)).eval()
    x = torch.randint(0, SMALL.vocab_size, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], model(x)[0], rtol=0, atol=0)
    model.train()
    with torch.no_grad():
        assert not torch.equal(model(x)[0], model(x)[0])


def reference_forward(
    model: TinyTransformer, input_ids: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward pass as one function, op for op as it was before embed/head/loss existed."""
    B, T = input_ids.shape
    pos = torch.arange(T)
    x = model.drop(model.tok_emb(input_ids) + model.pos_emb(pos))
    for block in model.blocks:
        x = block(x)
    logits = model.lm_head(model.ln_f(x))
    loss = F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))
    return logits, loss


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train-with-dropout"])
def test_forward_is_bit_identical_to_the_reference(training: bool) -> None:
    """The recorded Lab 1 numbers depend on it: same ops, same order, same dropout draws."""
    model = make_model().train(training)
    generator = torch.Generator().manual_seed(7)
    x = torch.randint(0, SMALL.vocab_size, (3, 12), generator=generator)
    y = torch.randint(0, SMALL.vocab_size, (3, 12), generator=generator)
    results = []
    for forward in (model.forward, lambda x, y: reference_forward(model, x, y)):
        torch.manual_seed(11)  # the same dropout masks for both
        model.zero_grad()
        logits, loss = forward(x, y)
        assert loss is not None
        loss.backward()
        results.append((logits, loss, [p.grad.clone() for p in model.parameters()]))
    (logits, loss, grads), (ref_logits, ref_loss, ref_grads) = results
    assert torch.equal(logits, ref_logits) and torch.equal(loss, ref_loss)
    for grad, ref_grad in zip(grads, ref_grads, strict=True):
        assert torch.equal(grad, ref_grad)
    if training:  # and the comparison can tell: other dropout masks give other logits
        torch.manual_seed(12)
        assert not torch.equal(model(x)[0], logits)


# --- pipeline stages -------------------------------------------------------------------

DEEP = dataclasses.replace(SMALL, num_hidden_layers=4)  # dropout 0.1: the tests run with it on
CUTS = {
    "1-way": [range(0, 4)],
    "2-way": [range(0, 2), range(2, 4)],
    "3-way": [range(0, 1), range(1, 3), range(3, 4)],
    "4-way": [range(0, 1), range(1, 2), range(2, 3), range(3, 4)],
}


def run_stages(stages: list[ModelStage], input_ids: torch.Tensor) -> torch.Tensor:
    """What a pipeline does for one micro-batch, in one process: each stage feeds the next."""
    x = input_ids
    for stage in stages:
        x = stage(x)
    return x


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("cut", CUTS.values(), ids=CUTS.keys())
def test_chained_stages_equal_the_model(cut: list[range], tie: bool) -> None:
    """Same logits, loss and gradients, bit for bit, in train mode (same dropout draws)."""
    model = make_model(dataclasses.replace(DEEP, tie_word_embeddings=tie))
    generator = torch.Generator().manual_seed(5)
    x = torch.randint(0, DEEP.vocab_size, (3, 12), generator=generator)
    y = torch.randint(0, DEEP.vocab_size, (3, 12), generator=generator)
    torch.manual_seed(3)
    logits, loss = model(x, y)
    assert loss is not None
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    stages = cut_into_stages(model, cut)
    torch.manual_seed(3)
    stage_logits = run_stages(stages, x)
    stage_loss = TinyTransformer.loss(stage_logits, y)
    stage_loss.backward()
    assert torch.equal(stage_logits, logits) and torch.equal(stage_loss, loss)
    for name, p in model.named_parameters():  # the gradients landed in the parent
        assert p.grad is not None and torch.equal(p.grad, grads[name]), name


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_stages_hold_the_parents_parameters_not_copies(tie: bool) -> None:
    model = make_model(dataclasses.replace(DEEP, tie_word_embeddings=tie))
    stages = cut_into_stages(model, CUTS["3-way"])
    for stage in stages:
        for name, p in stage.named_parameters():  # the same object, under the parent's name
            assert p is model.get_parameter(name), name
    keys = [set(stage.state_dict()) for stage in stages]
    assert set().union(*keys) == set(model.state_dict())
    assert "blocks.2.attn.qkv.weight" in keys[1]
    on_stages = Counter(id(p) for stage in stages for p in stage.parameters())
    assert set(on_stages) == {id(p) for p in model.parameters()}  # every parameter somewhere
    shared = [pid for pid, count in on_stages.items() if count > 1]
    # tied, one matrix sits on the first and the last stage; untied, every stage owns its own
    assert shared == ([id(model.tok_emb.weight)] if tie else [])


@pytest.mark.parametrize(
    ("layers", "expected"),
    [
        ([], "no stages"),
        ([range(0, 2), range(2, 2), range(2, 4)], "is empty"),
        ([range(0, 3), range(2, 4)], "overlaps the stage before: start it at block 3"),
        ([range(0, 1), range(2, 4)], "leaves a gap: start it at block 1"),
        ([range(1, 4)], "start it at block 0"),
        ([range(0, 2), range(2, 5)], "stay within range(0, 4)"),
        ([range(-1, 2), range(2, 4)], "stay within range(0, 4)"),
        ([range(0, 2)], "end the last stage at 4"),
        ([range(0, 4, 2)], "step 1"),
    ],
    ids=["none", "empty", "overlap", "gap", "no-first", "past-end", "negative", "short", "step"],
)
def test_a_bad_cut_is_a_one_line_usage_error(layers: list[range], expected: str) -> None:
    with pytest.raises(UsageError) as info:
        cut_into_stages(make_model(DEEP), layers)
    message = str(info.value)
    assert "\n" not in message and expected in message, message


def test_a_stage_refuses_the_wrong_input() -> None:
    model = make_model(DEEP)
    first, second = cut_into_stages(model, CUTS["2-way"])
    ids = torch.randint(0, DEEP.vocab_size, (2, 8))
    with pytest.raises(UsageError, match=r"takes token ids \(B, T\).*the first on input_ids"):
        first(torch.randn(2, 8, DEEP.hidden_size))
    with pytest.raises(UsageError, match=r"range\(2, 4\) takes the previous stage's output"):
        second(ids)  # a stage that does not embed has no input of its own
    assert second(first(ids)).shape == (2, 8, DEEP.vocab_size)  # in order, it runs


# --- attention split by head (tensor parallelism, in one process) ----------------------


def test_qkv_rows_of_one_head() -> None:
    cfg = ModelConfig(hidden_size=8, num_attention_heads=2)  # head_dim 4
    assert head_channels(cfg, range(1, 2)).tolist() == [4, 5, 6, 7]
    # q, k and v of head 1: three pieces, hidden_size apart
    assert qkv_rows(cfg, range(1, 2)).tolist() == [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23]


@pytest.mark.parametrize("t", [1, 2, 4])
def test_qkv_rows_of_the_parts_cover_every_row_once(t: int) -> None:
    cfg = SMALL  # 4 heads
    per_rank = cfg.num_attention_heads // t
    parts = [range(r * per_rank, (r + 1) * per_rank) for r in range(t)]
    rows = torch.cat([qkv_rows(cfg, heads) for heads in parts])
    assert sorted(rows.tolist()) == list(range(3 * cfg.hidden_size))
    assert all(len(qkv_rows(cfg, heads)) == 3 * cfg.hidden_size // t for heads in parts)


@pytest.mark.parametrize("heads", [range(0), range(-1, 2), range(3, 5)])
def test_heads_outside_the_model_are_refused(heads: range) -> None:
    with pytest.raises(UsageError, match=r"pick them from range\(0, 4\)") as info:
        qkv_rows(SMALL, heads)
    assert "\n" not in str(info.value)


def partial_attention(
    attn: CausalSelfAttention,
    cfg: ModelConfig,
    x: torch.Tensor,
    *,
    rows: torch.Tensor,
    channels: torch.Tensor,
) -> torch.Tensor:
    """What one tensor-parallel rank computes: attention from its rows of qkv, projected by its
    columns of proj, without proj's bias (added once, after the sum over ranks)."""
    B, T, _ = x.shape
    c = len(channels)  # this rank's channels: its heads x head_dim
    qkv = F.linear(x, attn.qkv.weight[rows], attn.qkv.bias[rows])  # (B, T, 3c)
    q, k, v = (
        t.view(B, T, c // cfg.head_dim, cfg.head_dim).transpose(1, 2)  # (B, nh_rank, T, hs)
        for t in qkv.split(c, dim=2)
    )
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh_rank, T, hs)
    y = y.transpose(1, 2).reshape(B, T, c)  # (B, T, c)
    return F.linear(y, attn.proj.weight[:, channels])  # (B, T, C): a partial sum


def attention_with_big_weights(cfg: ModelConfig) -> CausalSelfAttention:
    """Weights of size ~1/sqrt(C), not 0.02, so that the outputs are O(1) and 1e-6 means much."""
    torch.manual_seed(0)
    attn = CausalSelfAttention(cfg).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn_like(p) / cfg.hidden_size**0.5)
    return attn


def split_attention(
    cfg: ModelConfig, *, t: int, naive: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The full attention output and the sum over t ranks that each hold num_heads / t heads:
    with qkv_rows, or (naive) with t contiguous pieces of qkv's rows."""
    attn = attention_with_big_weights(cfg)
    x = torch.randn(2, 10, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    per_rank, piece = cfg.num_attention_heads // t, 3 * cfg.hidden_size // t
    with torch.no_grad():
        split = attn.proj.bias.clone()  # (C,): once, not once per rank
        for r in range(t):
            heads = range(r * per_rank, (r + 1) * per_rank)
            rows = torch.arange(r * piece, (r + 1) * piece) if naive else qkv_rows(cfg, heads)
            channels = head_channels(cfg, heads)
            split = split + partial_attention(attn, cfg, x, rows=rows, channels=channels)
        return attn(x), split


@pytest.mark.parametrize("num_heads", [4, 8])
@pytest.mark.parametrize("t", [2, 4])
def test_heads_split_across_ranks_sum_to_the_full_attention(t: int, num_heads: int) -> None:
    """Tolerance: 1e-6 absolute + 1e-6 relative on outputs of size ~1 (up to ~4), a few float32
    ulps: the parts are summed in another order. Measured here: at most 4.8e-7."""
    cfg = dataclasses.replace(SMALL, num_attention_heads=num_heads, dropout=0.0)
    full, split = split_attention(cfg, t=t)
    assert full.abs().mean() > 0.1  # outputs of size ~1: the tolerance is a strict one
    torch.testing.assert_close(split, full, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("t", [2, 4])
def test_a_contiguous_split_of_qkv_rows_is_wrong(t: int) -> None:
    """Why qkv_rows exists: rows 0..C-1 are q of every head, so with t = 2 rank 0 would get all
    of q and half of k, and rank 1 the other half of k and all of v."""
    full, split = split_attention(dataclasses.replace(SMALL, dropout=0.0), t=t, naive=True)
    assert (split - full).abs().max() > 0.1
