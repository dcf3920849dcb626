"""Numbers in the prose of docs/week-2/ that pass by rule, not by data.

Read by tools/prose_numbers.py; the format and the rules are in tests/docs/prose_rules/README.md.
"""

PROSE_RULES: dict[str, list[tuple[str, str]]] = {
    "week-2/index.md": [
        ("Rajbhandari et al. 2020, [arXiv:1910.02054]", "not a number"),  # the paper's id
        ("No 80 GB GPU (an A100's or H100's memory, by NVIDIA's datasheets)", "source"),
        ("ZeRO-1/2 just do the two halves at different moments", "not a number"),
        ("**3Ψ** for stage 3, which gathers the weights twice", "definition"),
        ("a plan for a 7 B model on 16 GPUs", "example"),
        ("The bf16 weights and gradients save 2 + 2 bytes per parameter", "definition"),
        ("removes 12Ψ(1 − 1/N) in mixed precision — most of the 16Ψ", "arithmetic"),
        ("Only stage 3 moves more (3Ψ, 1.5 × DDP)", "arithmetic"),
    ],
    "week-2/zero-from-scratch.md": [
        ("ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054)", "not a number"),  # the paper's id
        ("buckets that fill during backward (§5.2)", "not a number"),  # the paper's section
        ("shrinking its storage to 0 bytes", "definition"),  # zero.py: storage().resize_(0)
        ("a weight whose storage was shrunk to 0 bytes", "definition"),
        ("**3Ψ** — 1.5 × DDP's traffic", "arithmetic"),
        ("A unit used twice in a row", "not a number"),
        ("Ψ × 4 bytes × (N−1)/N × 2 = 25,984 × 4 × ½ × 2 = 103,936", "arithmetic"),
        # bench_zero.py: statistics.quantiles(ratios, n=4)
        (
            "The ratio's spread is the middle half of the rounds (25th to 75th percentile",
            "definition",
        ),
        ("Stage 1 does the same two halves", "not a number"),
    ],
    "week-2/deepspeed-zero.md": [
        ("in the paper's accounting: an all-reduce moves its tensor twice", "definition"),
        ("a + b is the same number in either order; halving it is exact", "not a number"),
    ],
    "week-2/comparison.md": [
        ("Exercise: plan a 7 B model on 2 nodes × 8 GPUs of 80 GB", "example"),
        ("gathers every unit across nodes twice a step", "definition"),
        ("fine for a course, not for 70 B", "example"),
    ],
    "week-2/fsdp.md": [
        ("through the slow network, twice a step", "definition"),  # forward and backward
        ("FSDP over 8 holds 16Ψ/8, half", "arithmetic"),
        ("The all-gathers (twice per step)", "definition"),
    ],
    "week-2/memory-calculator.md": [
        ("The output projection's input is not counted twice", "not a number"),
        ("the fp32 gradient partition that DeepSpeed's optimizer keeps (4 bytes)", "definition"),
        (
            "With bf16 ZeRO-3 on 64 GPUs of 80 GB, how many parameters fit in the model "
            "states, leaving 20 GB per GPU for activations?",
            "example",
        ),
        ("Solve for 60 GB", "arithmetic"),  # 80 GB - 20 GB
    ],
    "week-2/torchtitan.md": [
        ("What would you change to train a real llama3 8B with it?", "example"),
    ],
}
