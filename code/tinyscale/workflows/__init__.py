# --8<-- [start:map]
"""tinyscale.workflows: the practical workflows around training, from the data to the report.

The Practical workflows pages teach these. They may import core, comm, data_parallel,
pipeline_parallel, tensor_parallel, expert_parallel and low_precision; ops may import
them.

    module          taught on
    shards          workflows/data-at-scale.md
    shard_loader    workflows/data-at-scale.md
    profiling       workflows/profiling.md
    ddp_overlap     workflows/profiling.md
    mfu             workflows/profiling.md
    wandb_log       workflows/logging.md
    evaluation      workflows/evaluation.md
    lora            workflows/lora.md
"""
# --8<-- [end:map]
