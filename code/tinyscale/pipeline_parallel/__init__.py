# --8<-- [start:map]
"""tinyscale.pipeline_parallel: the model cut into stages, one per rank (Week 3).

Pipeline parallelism gives each rank a stage, a run of consecutive blocks, and streams
micro-batches through the stages: the schedules as data and their simulator, the
point-to-point links, the runtime, and torch's own pipelining on the same stages. They
import tinyscale.core and tinyscale.comm only.

    module              taught on
    schedules           week-3/pipeline-from-scratch.md
    p2p                 week-3/pipeline-from-scratch.md
    pipeline            week-3/pipeline-from-scratch.md
    torch_pipeline      week-3/pipeline-torchtitan.md, week-4/train-any-shape.md
"""
# --8<-- [end:map]
