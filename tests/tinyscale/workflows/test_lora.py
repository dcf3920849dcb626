"""LoRA from scratch (tinyscale.workflows.lora): step 0 is the base model, the formula for
what trains, merge and unmerge, parity with Hugging Face PEFT, the adapter file, bad input,
and the bytes DDP and FSDP2 move when only the adapters train (one launch of 2 gloo ranks)."""

import copy
import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import TIMEOUTS, prose, recorded_output, said
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.config import preset
from tinyscale.core.errors import UsageError
from tinyscale.core.model import TinyTransformer
from tinyscale.workflows.lora import (
    LoRAConfig,
    LoRALinear,
    adapter_parameters_on_paper,
    add_lora,
    copy_into_peft,
    ddp_and_fsdp,
    load_adapter,
    lora_layers,
    optimizer_state_bytes,
    save_adapter,
    set_merged,
    trainable_parameters,
)

TOLERANCE = 1e-6  # PEFT and ours: same operations, same order (bit for bit today)
MERGE_TOLERANCE = 1e-5  # W + s B A rounds once more than W x + s B (A x): fp32, |logits| ~ 1


def tiny(seed: int = 0) -> TinyTransformer:
    torch.manual_seed(seed)
    return TinyTransformer(preset("tiny"))


def trained_adapters(model: nn.Module) -> None:
    """B made non-zero, as after training: otherwise every comparison is trivially equal."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=gen) * 0.05)


def batch(seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(preset("tiny").vocab_size, (3, 17), generator=gen)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def test_step_0_is_the_base_model_exactly_and_only_a_and_b_train() -> None:
    model = tiny()
    x, _ = batch()
    before = model(x)[0]
    layers = add_lora(model, LoRAConfig(rank=4))
    assert list(layers) == [f"blocks.{b}.{t}" for b in (0, 1) for t in
                            ("attn.qkv", "attn.proj", "ffn.up", "ffn.down")]  # fmt: skip
    assert torch.equal(model(x)[0], before)  # B = 0: not close, equal
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{n}.lora_{m}" for n in layers for m in "AB"}
    assert all(
        torch.equal(layer.lora_B, torch.zeros_like(layer.lora_B)) for layer in layers.values()
    )
    assert all(layer.lora_A.abs().sum() > 0 for layer in layers.values())


@pytest.mark.parametrize(
    ("rank", "targets"),
    [(4, ("attn.qkv", "attn.proj", "ffn.up", "ffn.down")), (2, ("attn.qkv",)), (8, ("ffn.down",))],
)
def test_trainable_parameters_and_adamw_bytes_equal_the_formula(
    rank: int, targets: tuple[str, ...]
) -> None:
    model, cfg = tiny(), LoRAConfig(rank=rank, targets=targets)
    add_lora(model, cfg)
    h, i, L = 32, 64, 2  # the tiny preset, written out: r (d_in + d_out) per matrix
    by_hand = {"attn.qkv": h + 3 * h, "attn.proj": 2 * h, "ffn.up": h + i, "ffn.down": i + h}
    expected = L * rank * sum(by_hand[t] for t in targets)
    assert trainable_parameters(model) == adapter_parameters_on_paper(model.cfg, cfg) == expected
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    x, y = batch()
    model(x, y)[1].backward()
    optimizer.step()
    assert optimizer_state_bytes(optimizer) == 2 * 4 * expected  # exp_avg, exp_avg_sq in fp32


@pytest.mark.parametrize("targets", [("lm_head",), ("up", "qkv"), ("attn.proj", "lm_head")])
def test_the_formula_counts_every_target_add_lora_accepts(targets: tuple[str, ...]) -> None:
    """The head (once, not per block: untied here) and a name's end, as add_lora matches."""
    torch.manual_seed(0)
    model = TinyTransformer(dataclasses.replace(preset("tiny"), tie_word_embeddings=False))
    cfg = LoRAConfig(rank=2, targets=targets)
    add_lora(model, cfg)
    assert trainable_parameters(model) == adapter_parameters_on_paper(model.cfg, cfg)


def test_merge_equals_the_unmerged_forward_and_unmerge_gives_w_back() -> None:
    model = tiny()
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    add_lora(model, LoRAConfig(rank=4))
    trained_adapters(model)
    x, _ = batch()
    unmerged = model(x)[0]
    set_merged(model, True)
    layer = model.blocks[0].attn.qkv
    assert layer.merged and not torch.equal(layer.base.weight, weights["blocks.0.attn.qkv.weight"])
    assert (model(x)[0] - unmerged).abs().max() < MERGE_TOLERANCE
    set_merged(model, False)
    for name, layer in lora_layers(model).items():
        assert (layer.base.weight - weights[f"{name}.weight"]).abs().max() < 1e-7
    assert (model(x)[0] - unmerged).abs().max() < TOLERANCE  # W back, up to its rounding


def test_same_outputs_and_gradients_as_peft_lora() -> None:
    model, cfg = tiny(), LoRAConfig(rank=4, alpha=8.0)
    add_lora(model, cfg)
    trained_adapters(model)
    theirs = copy_into_peft(model, cfg)
    assert type(theirs.blocks[0].attn.qkv).__module__.startswith("peft.")
    assert trainable_parameters(theirs) == trainable_parameters(model)
    x, y = batch()
    ours_logits, ours_loss = model(x, y)
    their_logits, their_loss = theirs(x, y)
    assert (ours_logits - their_logits).abs().max() <= TOLERANCE
    ours_loss.backward()
    their_loss.backward()
    for name, layer in lora_layers(model).items():
        peft_layer = theirs.get_submodule(name)
        for ours, other in ((layer.lora_A, peft_layer.lora_A["default"].weight),
                            (layer.lora_B, peft_layer.lora_B["default"].weight)):  # fmt: skip
            assert ours.grad is not None and ours.grad.abs().max() > 0
            assert (ours.grad - other.grad).abs().max() <= TOLERANCE


def test_the_adapter_file_holds_only_a_and_b_and_reloads_onto_a_fresh_base(tmp_path: Path) -> None:
    model, cfg = tiny(), LoRAConfig(rank=2, targets=("attn.qkv", "ffn.up"))
    base = copy.deepcopy(model)
    add_lora(model, cfg)
    trained_adapters(model)
    path = save_adapter(model, cfg, tmp_path / "adapter.pt")
    assert [p.name for p in tmp_path.iterdir()] == ["adapter.pt"]  # no temporary file left
    state = torch.load(path, weights_only=True)
    assert sum(t.numel() for t in state["adapter"].values()) == trainable_parameters(model)
    assert load_adapter(base, path) == cfg
    x, _ = batch()
    assert torch.equal(base(x)[0], model(x)[0])


def test_loading_an_adapter_onto_another_shape_is_refused(tmp_path: Path) -> None:
    model, cfg = tiny(), LoRAConfig(rank=2)
    add_lora(model, cfg)
    path = save_adapter(model, cfg, tmp_path / "adapter.pt")
    with pytest.raises(UsageError, match="trained with hidden_size=32, but the config says"):
        load_adapter(TinyTransformer(preset("micro")), path)


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (dict(rank=33), "LoRA rank 33 does not fit blocks.0.attn.qkv (32 -> 96): use a rank from 1 to 32"),
        (dict(rank=4, targets=("attn.qkv", "attn.query")),
         "LoRA target 'attn.query' matches no nn.Linear of the model: use some of attn.proj, "
         "attn.qkv, ffn.down, ffn.up"),
        (dict(rank=4, targets=("attn.qkv", "lm_head")),
         "LoRA target 'lm_head' would adapt lm_head, whose weight is also tok_emb.weight (tied "
         "embeddings): merging B A into it would change both; leave it out of the targets"),
    ],
)  # fmt: skip
def test_bad_rank_or_target_is_one_line_and_leaves_the_model_as_it_was(
    cfg: dict, message: str
) -> None:
    model = tiny()
    with pytest.raises(UsageError) as err:
        add_lora(model, LoRAConfig(**cfg))
    assert str(err.value) == message
    assert not lora_layers(model) and all(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize(
    ("cfg", "message"),
    [(dict(rank=0), "LoRA rank must be a whole number >= 1, got 0: use e.g. 8"),
     (dict(rank=-1), "got -1"), (dict(alpha=0.0), "LoRA alpha must be a positive number"),
     (dict(targets=()), "no LoRA targets")],
)  # fmt: skip
def test_bad_config_is_one_line_naming_the_fix(cfg: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        LoRAConfig(**cfg)


def test_a_lora_layer_refuses_a_rank_above_min_d_in_d_out() -> None:
    with pytest.raises(
        UsageError, match=r"rank 9 does not fit layer \(16 -> 8\): use a rank from 1 to 8"
    ):
        LoRALinear(nn.Linear(16, 8), rank=9, alpha=1.0)


@pytest.fixture(scope="module")
def two_ranks() -> list[dict]:
    return run_on_ranks(ddp_and_fsdp, 2, 3, 4, 0, **TIMEOUTS)  # 3 steps, rank 4, seed 0


def test_ddp_all_reduces_only_the_adapters_4_bytes_each_per_step(two_ranks: list[dict]) -> None:
    model = tiny()
    add_lora(model, LoRAConfig(rank=4))
    trainable = trainable_parameters(model)
    assert trainable < model.num_parameters() / 5
    for result in two_ranks:
        assert result["ddp"]["trainable"] == trainable
        assert result["ddp"]["bytes_per_step"] == [4 * trainable] * 3  # every step, fp32 grads
        assert result["ddp"]["spread"] == 0.0  # the ranks' adapters stay bit-identical
    assert two_ranks[0]["ddp"]["losses"] != two_ranks[1]["ddp"]["losses"]  # different batches


def test_fsdp2_shards_mixed_frozen_units_and_reduce_scatters_only_the_adapters(
    two_ranks: list[dict],
) -> None:
    model = tiny()
    add_lora(model, LoRAConfig(rank=4))
    block = sum(p.numel() for p in model.blocks[0].parameters())  # frozen W and b, and A, B
    root = model.num_parameters() - 2 * block  # embeddings and the final norm
    for result in two_ranks:
        fsdp, ddp = result["fsdp"], result["ddp"]
        assert fsdp["bytes_last_step"] == {
            "reduce_scatter_single": 4 * trainable_parameters(model),
            # each block gathered for its forward and again for its backward; the root once
            "all_gather_single": 4 * (2 * 2 * block + root),
        }
        assert (
            max(abs(a - b) for a, b in zip(fsdp["losses"], ddp["losses"], strict=True)) <= TOLERANCE
        )


def test_the_pages_recorded_ddp_and_fsdp_run_and_its_prose_are_the_formulas() -> None:
    model = tiny()
    add_lora(model, LoRAConfig(rank=4))
    trainable, frozen = (
        trainable_parameters(model),
        model.num_parameters() - trainable_parameters(model),
    )
    block = sum(p.numel() for p in model.blocks[0].parameters())
    root = model.num_parameters() - 2 * block
    gathered = 4 * (2 * 2 * block + root)
    lines = recorded_output("workflows/lora.md", "run_on_ranks(ddp_and_fsdp")
    for rank in (0, 1):
        assert (
            f"rank {rank}: {trainable:,} trainable | DDP all-reduces {[4 * trainable] * 3}"
            in lines[2 * rank]
        )
        assert lines[2 * rank + 1] == (
            f"rank {rank}: FSDP2 step 3 {{'all_gather_single': {gathered}, "
            f"'reduce_scatter_single': {4 * trainable}}} | losses - DDP's: 0.0"
        )
    page = prose("workflows/lora.md")
    assert said(page, r"DDP all-reduces `4 bytes x ([\d,]+) = ([\d,]+)` bytes every step") == (
        f"{trainable:,}", f"{4 * trainable:,}")  # fmt: skip
    assert said(page, r"nothing of the ([\d,]+) frozen parameters") == (f"{frozen:,}",)
    assert said(page, r"`4 x \(2 x 2 x ([\d,]+) \+ ([\d,]+)\) = ([\d,]+)` bytes") == (
        f"{block:,}", f"{root:,}", f"{gathered:,}")  # fmt: skip
