# --8<-- [start:map]
"""tinyscale.comm: processes and the messages between them.

Joining a process group, running a function on N ranks, collectives built from send and
recv, and what they cost; what every distributed job checks before it starts. Session B,
Session C, Lab 2 and Week 1 teach these; they import only tinyscale.core.

    module          taught on
    dist            week-1/ddp-from-scratch.md, workshop/lab-2.md, workshop/session-c.md, week-4/parallelism-2d-3d.md
    comm_model      workshop/session-b.md, week-1/ddp-from-scratch.md, week-1/collectives.md
    launch          week-1/index.md
    workers         week-1/index.md
    collectives     week-1/collectives.md
    pipelined_ring  week-1/collectives.md
    counter         week-2/zero-from-scratch.md
    tree_allreduce  week-1/collectives.md
    recursive_doubling  week-1/collectives.md
    choose_allreduce    week-1/collectives.md
    latency         operations/nccl-network.md
    parallel_layout week-4/parallelism-2d-3d.md
    job             workshop/lab-2.md, week-4/train-any-shape.md
    step_stats      workshop/lab-2.md
"""
# --8<-- [end:map]
