# --8<-- [start:map]
"""tinyscale.tensor_parallel: each weight matrix split over ranks (Week 4).

Tensor parallelism splits each weight matrix, and sequence parallelism its activations
by position: the autograd operators, the vocabulary-parallel embedding and loss, the
split model, its parity with one process, and the same with DTensor, also on one
pipeline stage. They import tinyscale.core and tinyscale.comm only.

    module              taught on
    tp_ops              week-4/tensor-parallel-from-scratch.md
    vocab_parallel      week-4/tensor-parallel-from-scratch.md
    tp_model            week-4/tensor-parallel-from-scratch.md
    tp_parity           week-4/tensor-parallel-from-scratch.md
    tp_dtensor          week-4/tensor-parallel-from-scratch.md
    tp_stage            week-4/train-any-shape.md
"""
# --8<-- [end:map]
