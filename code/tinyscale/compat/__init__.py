# --8<-- [start:map]
"""tinyscale.compat: third-party engines on the course's model: DeepSpeed, torchtitan, Accelerate.

Each module reads an engine's own configs, patches what it needs on a CPU, or proves it
equal to what the course built. They may import any of tinyscale.core, tinyscale.comm,
tinyscale.data_parallel and the folder of each model parallelism (pipeline_parallel,
tensor_parallel, expert_parallel); those never import them.

    module              taught on
    accelerate_log      workshop/accelerate.md
    deepspeed_config    workshop/deepspeed.md
    deepspeed_engine    workshop/deepspeed.md
    deepspeed_checkpoint workshop/deepspeed.md
    deepspeed_costs     week-2/deepspeed-zero.md, workshop/deepspeed.md
    zero_vs_deepspeed   week-2/deepspeed-zero.md
    titan_compat        week-2/torchtitan.md
    titan_config        week-2/torchtitan.md, week-3/pipeline-torchtitan.md
    titan_config        week-3/fp8.md, week-3/moe.md
    titan_config        week-4/tensor-parallel-torchtitan.md
"""
# --8<-- [end:map]
