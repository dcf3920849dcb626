"""Numbers in the prose of docs/week-1/ that pass by rule, not by data.

Read by tools/prose_numbers.py; the format and the rules are in tests/docs/prose_rules/README.md.
"""

PROSE_RULES: dict[str, list[tuple[str, str]]] = {
    "week-1/collectives.md": [
        (
            "The binomial tree doubles the number of ranks that have the data every round: "
            "rank 0 sends to 1; then 0 → 2 and 1 → 3; then 0 → 4, 1 → 5, 2 → 6, 3 → 7.",
            "arithmetic",
        ),
        (
            "against 450 GB/s each way per GPU over NVLink on an H100 (900 GB/s both ways "
            "together, in NVIDIA's H100 datasheet)",
            "source",
        ),
        ("a whole chunk (64 MiB / 2 = 32 MiB at N = 2)", "arithmetic"),
        (
            "uses segments of at most 1 MiB (`kMaxSegmentSize` in gloo's `gloo/allreduce.h`)",
            "source",
        ),
        (
            "(4 MiB by default, in NCCL's documentation of its environment variables)",
            "source",
        ),
        ("N = 1024 takes 2 × 10 = 20 steps against the ring's 2 × 1023 = 2046", "arithmetic"),
        ("7 S against 2 · 7/8 · S = 1.75 S: four times more", "arithmetic"),
        ("An all-reduce of 1 MB on 1,024 ranks: ring or tree?", "example"),
        ("The ring needs 2 × 1023 = 2046 steps of 1 MB / 1024 ≈ 1 KB each", "arithmetic"),
        ("the tree needs 2 × 10 = 20 steps", "arithmetic"),
        ("For a 1 GB tensor the bytes dominate", "example"),
        (
            "rank 1 sends its chunk 1, 4 float32 (16 bytes), where rank 0 expects 3 (12 bytes)",
            "arithmetic",
        ),
        ("Python's cost per message α halves", "example"),
        ("each extra segment now costs half as much", "example"),
        ("recursive doubling", "not a number"),  # the algorithm's name, as MPICH's papers say
        ("Recursive doubling", "not a number"),
        ("recursive halving", "not a number"),
        ("a 4 KiB all-reduce moves almost nothing", "example"),
        ("What `all_reduce` picks on two and on four ranks, for 4 KiB and 16 MiB", "example"),
        ("log₂ P + 2 steps, (log₂ P + 1) · S bytes", "definition"),  # the fold's formula
        ("it pays the ring's steps even for 4 KiB", "example"),
        ("from 4 KiB to 16 MiB, and fits t = α + S / B", "definition"),
        ("reached 0.9 × gloo's bus bandwidth at every size from 4 KiB to 64 MiB", "definition"),
    ],
    "week-1/ddp-from-scratch.md": [
        (
            "*PyTorch Distributed: Experiences on Accelerating Data Parallel Training*, §3.2",
            "not a number",
        ),
        (
            "is the mean of the two halves' mean losses, so its gradient is the mean of the "
            "two halves' gradients",
            "not a number",
        ),
        ("one flat copy of all gradients doubles gradient memory", "arithmetic"),
        ("a 7B model has hundreds", "example"),
        ("twice more than the algorithm needs, and holds them twice in memory", "arithmetic"),
        ("the middle half of those rounds' ratios", "definition"),
    ],
}
