"""Numbers in the prose of docs/week-3/ that pass by rule, not by data.

Read by tools/prose_numbers.py; the format and the rules are in tests/docs/prose_rules/README.md.
"""

PROSE_RULES: dict[str, list[tuple[str, str]]] = {
    "week-3/pipeline-from-scratch.md": [
        # fp32's bytes per value, the constant of the traffic formula that
        # tests/tinyscale/pipeline_parallel/test_pipeline.py checks against the counted bytes
        ("2 × (B/m) × T × C × 4 bytes (fp32) per micro-batch", "definition"),
        ("one all-reduce of V × C × 4 bytes", "definition"),
    ],
    "week-3/fp8.md": [
        (
            "on an H100, bf16 matmuls run at about 1,000 TFLOP/s and fp8 at about 2,000 "
            "(NVIDIA's data sheet, dense)",
            "source",
        ),
        # the input of `python -m tinyscale.low_precision.scaling` (its main)
        ("Eight values of about 1e-3 per row, four rows, one outlier of 50 in row 0", "example"),
        (
            "An H100's fp8 tensor cores have twice the bf16 peak rate (NVIDIA's data sheet)",
            "source",
        ),
    ],
    "week-3/moe.md": [
        # expert parallelism by its definition: a dispatch there and a combine back
        ("tokens that travel between GPUs twice per layer", "definition"),
        ("every token crosses the network twice per layer and direction", "definition"),
        (
            "A factor of 1 is exactly the fair share; 1.25 leaves a quarter of headroom",
            "arithmetic",
        ),
        # experts as wide as the dense FFN divided by k (convert_to_moe's default)
        ("Top 2 of 8 half-width experts", "definition"),
        # tinyscale_moe's expert_parallel_degree = 2 over 4 ranks
        ("4 experts per half, and each half is then sharded 2 ways", "definition"),
        (
            "DeepSeek-V3 used 0.001 over far more steps (its technical report, Liu et al. 2024)",
            "source",
        ),
    ],
}
