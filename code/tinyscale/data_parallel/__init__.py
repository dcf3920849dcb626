# --8<-- [start:map]
"""tinyscale.data_parallel: every rank trains the whole model on its own share of the data.

DDP, then sharding the model states across the data-parallel ranks (ZeRO, FSDP), and
the checkpoints that go with them. Lab 2 and Weeks 1-2 teach these; they import
tinyscale.core and tinyscale.comm.

    module                        taught on
    ddp_training                  workshop/lab-2.md
    ranked_checkpoint             workshop/checkpoints.md
    dcp_checkpoint                workshop/checkpoints.md
    checkpoint_demo               workshop/checkpoints.md
    data_sharding                 week-1/data-sharding.md
    ddp                           week-1/ddp-from-scratch.md
    ddp_buckets                   week-1/ddp-from-scratch.md
    ddp_views                     week-1/ddp-from-scratch.md
    zero                          week-2/zero-from-scratch.md
    zero_vs_ddp                   week-2/zero-from-scratch.md
    zero_prefetch                 week-2/zero-from-scratch.md
    reduce_order                  week-2/zero-from-scratch.md
    unused_and_frozen             week-2/zero-from-scratch.md, week-4/zero3-any-optimizer.md
    memory_calculator             week-2/memory-calculator.md, workshop/deepspeed.md, week-2/zero-from-scratch.md, week-5/recomputation.md
    fsdp                          week-2/fsdp.md
    sharded_optimizer             week-4/parallelism-2d-3d.md
    fully_sharded                 week-4/zero3-any-optimizer.md
    fully_sharded_vs_one_process  week-4/zero3-any-optimizer.md
"""
# --8<-- [end:map]
