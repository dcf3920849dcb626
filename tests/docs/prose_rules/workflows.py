"""Numbers in the prose of docs/workflows/ that pass by rule, not by data.

Read by tools/prose_numbers.py; the format and the rules are in tests/docs/prose_rules/README.md.
"""

PROSE_RULES: dict[str, list[tuple[str, str]]] = {
    "workflows/data-at-scale.md": [
        ("would skip some blocks and read others twice", "not a number"),
        ("A run on 1 rank stops after 2 steps and saves the loader's state", "example"),
        ("A stream of 20 train tokens and 4 held-out tokens, 4 tokens per shard", "example"),
    ],
    "workflows/profiling.md": [
        (
            "the **dense bf16** number of NVIDIA's data sheet: H100 SXM 989 TFLOP/s (the 1,979 "
            "on the sheet assumes 2:4 sparsity)",
            "source",
        ),
        (
            "Large runs report 38–43 % (Llama 3 405B on H100s, Dubey et al. 2024), 46 % (PaLM "
            "540B on TPU v4, Chowdhery et al. 2022) and 55 % (a 175B model on 12,288 GPUs, "
            "MegaScale, Jiang et al. 2024)",
            "source",
        ),
    ],
    "workflows/lora.md": [
        (
            "doubling r doubles the terms summed in `B (A x)`, and halves the scale `alpha / r`",
            "arithmetic",
        ),
    ],
    "workflows/logging.md": [
        ("event files. W&B is a third. The logger", "not a number"),
    ],
}
