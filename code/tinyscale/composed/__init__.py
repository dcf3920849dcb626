# --8<-- [start:map]
"""tinyscale.composed: the course's own pieces combined on one grid of ranks (2D, 3D).

Tensor parallelism inside, pipeline stages around it, data parallelism and ZeRO across
(Week 4), and a checkpoint any such shape resumes from: built from tinyscale.tensor_parallel, tinyscale.pipeline_parallel and
tinyscale.data_parallel, which may not import each other, so their compositions live
here. They import core, comm and the folder of each parallelism.

    module              taught on
    two_d               week-4/parallelism-2d-3d.md
    three_d             week-4/parallelism-2d-3d.md
    ladder              week-4/parallelism-2d-3d.md
    planner             week-4/parallelism-2d-3d.md
    shape_checkpoint    week-4/train-any-shape.md
"""
# --8<-- [end:map]
