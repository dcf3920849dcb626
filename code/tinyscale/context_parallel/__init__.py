# --8<-- [start:map]
"""tinyscale.context_parallel: one sequence split across ranks by position (Week 5).

Context parallelism gives each rank a part of every sequence and runs attention, the
only layer that mixes positions, across ranks: the online softmax that merges partial
results, ring attention (forward and backward, over isend/irecv), the causal load
balance of the head-tail split, Llama 3's all-gather of keys and values, and the course
model on a split sequence. They import tinyscale.core and tinyscale.comm only.

    module              taught on
    online_softmax      week-5/context-parallel.md
    ring_attention      week-5/context-parallel.md
    load_balance        week-5/context-parallel.md
    allgather_kv        week-5/context-parallel.md
    cp_model            week-5/context-parallel.md
"""
# --8<-- [end:map]
