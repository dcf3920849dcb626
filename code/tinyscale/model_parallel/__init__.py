# --8<-- [start:map]
"""tinyscale.model_parallel: each rank holds a part of the model, not a copy of it.

Pipeline parallelism cuts the model into stages, one per rank, and streams micro-batches
through them (Week 3); a mixture of experts splits the FFN into experts, and expert
parallelism puts them on different ranks (Week 3); tensor parallelism splits each weight
matrix, and sequence parallelism its activations by position (Week 4). They import
tinyscale.core and tinyscale.comm only.

    module              taught on
    schedules           week-3/pipeline-from-scratch.md
    p2p                 week-3/pipeline-from-scratch.md
    pipeline            week-3/pipeline-from-scratch.md
    torch_pipeline      week-3/pipeline-torchtitan.md
    moe_routing         week-3/moe.md
    moe                 week-3/moe.md
    moe_compare         week-3/moe.md
    expert_parallel     week-3/moe.md
    tp_ops              week-4/tensor-parallel-from-scratch.md
    vocab_parallel      week-4/tensor-parallel-from-scratch.md
    tensor_parallel     week-4/tensor-parallel-from-scratch.md
    tp_parity           week-4/tensor-parallel-from-scratch.md
    tp_dtensor          week-4/tensor-parallel-from-scratch.md
"""
# --8<-- [end:map]
