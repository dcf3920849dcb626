# --8<-- [start:map]
"""tinyscale.core: one process. The model, its data, the hand-written training loop.

Session A and Lab 1 build these; every later lesson imports them. They import nothing
else of tinyscale: a core module runs in one process, with no process group.

    module          taught on
    errors          workshop/lab-1.md
    outputs         start/testing.md
    config          workshop/lab-1.md
    cli             workshop/session-a.md
    device          start/overview.md, workshop/session-a.md
    model           workshop/lab-1.md, week-4/tensor-parallel-from-scratch.md
    data            workshop/lab-1.md, workshop/session-a.md
    metrics         workshop/lab-1.md
    checkpoint      workshop/lab-1.md, workshop/session-a.md
    training        workshop/session-a.md
    step            workshop/session-a.md
    memory          workshop/session-a.md
    flops           workflows/profiling.md
    accumulation    workshop/lab-2.md, workshop/session-b.md
    precision       workshop/session-b.md
    comparison      week-3/fp8.md
    parity          week-1/ddp-from-scratch.md
    recompute       week-5/recomputation.md
"""
# --8<-- [end:map]
