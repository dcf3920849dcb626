"""Numbers in the prose of docs/week-4/ that pass by rule, not by data.

Read by tools/prose_numbers.py; the format and the rules are in tests/docs/prose_rules/README.md.
"""

PROSE_RULES: dict[str, list[tuple[str, str]]] = {
    "week-4/index.md": [
        ("a planner that proposes a layout for a 7B and a 70B model", "example"),
        ("A 70B model trains on 64 GPUs, 8 per node", "example"),
    ],
    "week-4/parallelism-2d-3d.md": [
        ("Ask the course's formulas which layout a 7B and a 70B model need", "example"),
        ("Two ranks, each on half of the batch", "definition"),
        ("This is torchtitan's own recipe for Llama 3 8B", "source"),
        ("torchtitan's recipe for Llama 3 70B", "source"),
        ("the Llama 3 paper, Dubey et al. 2024, reports 38–43 % of it on H100s", "source"),
        ("Narayanan et al. 2021, §4.1", "source"),
    ],
    "week-4/tensor-parallel-torchtitan.md": [
        # the two parts of a split, named: no share is stated
        ("So each half of a block (attention, then the FFN)", "not a number"),
        ("They hold halves of one model", "not a number"),
        ("with SP they gather their halves of the positions", "not a number"),
        ("So the two TP halves of `tok_embeddings`", "not a number"),
        ("With TP 2 on a CPU, `w1`'s two halves start equal", "not a number"),
        ("No. Both halves see the same input", "not a number"),
        (
            "and `w2`'s two halves (equal too) weigh them the same way. The two halves get",
            "not a number",
        ),
    ],
    "week-4/train-any-shape.md": [
        # the flags' values: TP 2 cuts a matrix in two, FSDP 2 cuts that again
        (
            "| `--fsdp 2 --tp 2` | half of every matrix, and half of that half between steps",
            "definition",
        ),
        ("| `--dp 2 --tp 2` | half of every matrix", "definition"),
        ("| `--pp 2 --tp 2` | half of the matrices of one block", "definition"),
        ("so a stage sends each TP partner's half to the partner", "definition"),
        ("each stage is now split by TP and sends half of the positions to the next", "definition"),
        ("Why can `--pp 2 --tp 2` send only half of the activation between stages?", "definition"),
        ("the next stage needs the same half", "not a number"),
        ("every group with a 2 s timeout", "definition"),  # the demo's --timeout-s default
    ],
    "week-4/zero3-any-optimizer.md": [
        ("Clipping each shard by its own norm would be wrong twice", "not a number"),
        ("builds the tiny model three times from one seed", "not a number"),
        ("one order; the two ranks add two halves", "definition"),  # N = 2, 4 sequences each
    ],
}
