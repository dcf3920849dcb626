"""Numbers in the prose of "LoRA fine-tuning" (docs/workflows/lora.md) that no output block
shows. tests/scripts/test_finetune_lora.py and tests/tinyscale/workflows/test_lora.py compare
the table and the recorded runs with the formulas; this module checks the rest:

- what AdamW keeps per parameter, from a real AdamW's state (``optimizer_state_bytes``);
- the embeddings' share of the Lab model, from the model's parameters;
- the weight gradients' share of the backward: 2 N of 4 N in the 6 N count
  (tinyscale.workflows.mfu), and what torch's FLOP counter measures on the Lab model;
- Llama 2 7B at the same rank, from its published shape (Touvron et al. 2023) and the
  course's formula, ``adapter_parameters_on_paper``;
- the runs' settings (steps, learning rates, held-out share, rank, processes) against their
  commands, the scripts' defaults and the recorded output;
- the tolerance the page says the PEFT test allows, against that test's constant.
"""

from __future__ import annotations

import ast
import re

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from helpers import ROOT, fails_when_changed, load_script, prose, recorded_output, said
from tinyscale.core.config import ModelConfig, load_model_config, preset
from tinyscale.core.flops import matmul_weights
from tinyscale.core.model import TinyTransformer
from tinyscale.core.training import TrainConfig
from tinyscale.workflows.lora import (
    LoRAConfig,
    adapter_parameters_on_paper,
    add_lora,
    optimizer_state_bytes,
    trainable_parameters,
)

PAGE = "workflows/lora.md"
# Llama 2 7B's shape, from its paper (Touvron et al. 2023) and its published config
LLAMA2_7B = {"hidden": 4096, "mlp": 11008, "blocks": 32, "vocab": 32000}


def lab_model() -> TinyTransformer:
    torch.manual_seed(0)
    return TinyTransformer(load_model_config())


def llama2_7b_parameters() -> int:
    """Embeddings and untied head, per block q k v o (4 d^2), a gated MLP (3 d i) and two
    RMSNorms (2 d), the final norm."""
    d, i, n, v = (LLAMA2_7B[k] for k in ("hidden", "mlp", "blocks", "vocab"))
    return 2 * v * d + n * (4 * d * d + 3 * d * i + 2 * d) + d


def llama2_7b_adapter() -> int:
    """The course's formula on Llama 2 7B's widths, r = 8, the same four projections."""
    shape = ModelConfig(hidden_size=LLAMA2_7B["hidden"], intermediate_size=LLAMA2_7B["mlp"],
                        num_hidden_layers=LLAMA2_7B["blocks"], num_attention_heads=32,
                        vocab_size=LLAMA2_7B["vocab"], max_position_embeddings=4096)  # fmt: skip
    return adapter_parameters_on_paper(shape, LoRAConfig(rank=8))


def check_adamw_bytes(text: str) -> None:
    states, nbytes = said(text, r"what AdamW keeps: (\d) states x (\d) bytes per trainable")
    (each,) = said(text, r"16,384 trainable parameters, (\d) bytes each in AdamW")
    model = lab_model()
    add_lora(model, LoRAConfig(rank=8))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params)
    model(*[torch.randint(0, 1024, (2, 8))] * 2)[1].backward()
    optimizer.step()
    per_parameter = optimizer_state_bytes(optimizer) / trainable_parameters(model)
    assert int(states) * int(nbytes) == int(each) == per_parameter


def check_shares(text: str) -> None:
    width, mlp, adapter, share, embeddings = said(
        text,
        r"On Llama 2 7B \(Touvron et al\. 2023: 32 blocks of width ([\d,]+), MLPs of ([\d,]+)\) "
        r"the same rank on the same four projections would be ([\d.]+)M parameters by the "
        r"formula, ([\d.]+) % of the weights; here the model is so small that its embeddings, "
        r"which LoRA leaves alone, are (\d+) % of it",
    )
    assert (int(width.replace(",", "")), int(mlp.replace(",", ""))) == (
        LLAMA2_7B["hidden"], LLAMA2_7B["mlp"])  # fmt: skip
    assert round(llama2_7b_parameters() / 1e9) == 7
    assert float(adapter) == round(llama2_7b_adapter() / 1e6, 1)
    assert float(share) == round(100 * llama2_7b_adapter() / llama2_7b_parameters(), 1)
    model = lab_model()
    emb = model.tok_emb.weight.numel() + model.pos_emb.weight.numel()
    assert int(embeddings) == round(100 * emb / model.num_parameters())
    said(text, r"the size of A and B: tens of megabytes for Llama 2 7B at r = 8\)")
    assert 10e6 <= 4 * llama2_7b_adapter() < 100e6, "fp32: tens of megabytes"


def backward_flops(model: TinyTransformer) -> int:
    x = torch.randint(0, model.cfg.vocab_size, (4, model.cfg.max_position_embeddings))
    _, loss = model(x, x)
    with FlopCounterMode(display=False) as counter:
        loss.backward()
    return counter.get_total_flops()


def check_weight_gradients(text: str) -> None:
    two, four, half, counted = said(
        text,
        r"In the 6 N count of \[Profiling and MFU\]\(profiling\.md#flops-per-token-and-mfu\) "
        r"they are (\d) N of the backward's (\d) N FLOPs per token: (half) of it \((\d+) % of "
        r"the Lab model's backward by torch's FLOP counter",
    )
    assert int(two) / int(four) == {"half": 1 / 2, "a third": 1 / 3}[half]
    cfg = load_model_config()
    whole = backward_flops(lab_model())
    activations_only = lab_model()  # every weight frozen; pos_emb lets the gradient flow
    for name, p in activations_only.named_parameters():
        p.requires_grad_(name == "pos_emb.weight")
    weights = whole - backward_flops(activations_only)
    tokens = 4 * cfg.max_position_embeddings
    assert weights == int(two) * matmul_weights(cfg) * tokens  # 2 N per token, exactly
    assert int(counted) == round(100 * weights / whole)


def check_runs(text: str) -> None:
    base_steps = said(
        text, r"--epochs 2 --max-steps (\d+) --eval-every \d+ --output-dir runs/lora/"
    )
    (fine_steps,) = said(text, r"step_000100\.pt --max-steps (\d+)\s")
    rank, steps = said(text, r"Then LoRA, rank (\d+) on every projection, (\d+) steps on asyncio")
    assert int(rank) == load_script("finetune_lora").parse_args(["--base", "x"]).rank
    assert steps == fine_steps
    pre, adapters = said(
        text, r"the base saw (\d+) steps of pre-training, the adapters (\d+) steps of asyncio"
    )
    assert (pre, adapters) == (base_steps[0], fine_steps)
    lora_lr, lab_lr = said(text, r"higher than Lab 1's \((\de-\d) against (\de-\d)\)")
    assert float(lora_lr) == load_script("finetune_lora").DEFAULTS.lr
    assert float(lab_lr) == TrainConfig().lr
    (percent,) = said(text, r"Held out is the last (\d+) % of the new stream")
    lines = recorded_output(PAGE, "step_000100.pt --max-steps 50")
    train, heldout = (
        int(v) for v in re.search(r"(\d+) training blocks, (\d+) held-out", lines[2]).groups()
    )
    assert int(percent) == round(100 * heldout / (train + heldout))
    lora_rank, n_steps, procs = said(
        text, r"Both on the `tiny` preset, rank (\d+), (\d+) steps, (\d+) gloo processes:"
    )
    assert said(text, r"run_on_ranks\(ddp_and_fsdp, (\d+), (\d+), (\d+)\)") == (
        procs,
        n_steps,
        lora_rank,
    )


def check_fsdp_gathers(text: str) -> None:
    twice, blocks, gathers = said(
        text,
        r"so each block is gathered (twice) and the root once, `4 x \((\d) x (\d) x [\d,]+ \+",
    )
    assert int(gathers) == {"twice": 2, "once": 1}[twice]  # the forward and the backward
    assert int(blocks) == preset("tiny").num_hidden_layers


def check_peft_tolerance(text: str) -> None:
    (allowed,) = said(text, r"`tests/tinyscale/workflows/test_lora\.py` allows (\de-\d+)\.")
    tree = ast.parse((ROOT / "tests/tinyscale/workflows/test_lora.py").read_text())
    (tolerance,) = [
        ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "TOLERANCE"
    ]
    assert float(allowed) == tolerance


CHECKS = [check_adamw_bytes, check_shares, check_weight_gradients, check_runs, check_fsdp_gathers,
          check_peft_tolerance]  # fmt: skip


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_the_model_the_code_and_the_runs(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_adamw_bytes, "8 bytes each in AdamW", "12 bytes each in AdamW"),
        (check_shares, "are 41 % of it", "are 60 % of it"),
        (check_shares, "14.0M parameters", "28.0M parameters"),
        (check_shares, "0.2 % of the weights", "0.9 % of the weights"),
        (check_weight_gradients, "half of it", "a third of it"),
        (check_weight_gradients, "(45 % of", "(33 % of"),
        (check_runs, "(3e-2 against 3e-3)", "(1e-2 against 3e-3)"),
        (check_runs, "the last 10 % of the new stream", "the last 20 % of the new stream"),
        (check_runs, "the adapters 50 steps", "the adapters 80 steps"),
        (check_runs, "rank 4, 3 steps", "rank 4, 5 steps"),
        (check_fsdp_gathers, "gathered twice and", "gathered once and"),
        (check_peft_tolerance, "allows 1e-6.", "allows 1e-5."),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
