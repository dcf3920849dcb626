# --8<-- [start:map]
"""tinyscale.composed: the parallelisms combined on one layout (2D, 3D, any shape).

Tensor parallelism inside, pipeline stages around it, data parallelism and ZeRO across
(Week 4): the course's own pieces (two_d, three_d), torch's (parallelize), and a
checkpoint any such shape resumes from. They are built from tinyscale.tensor_parallel,
tinyscale.pipeline_parallel and tinyscale.data_parallel, which may not import each other,
so their compositions live here. They import core, comm and the folder of each
parallelism.

    module              taught on
    two_d               week-4/parallelism-2d-3d.md
    three_d             week-4/parallelism-2d-3d.md
    ladder              week-4/parallelism-2d-3d.md
    planner             week-4/parallelism-2d-3d.md
    parallelize         week-4/train-any-shape.md
    shape_checkpoint    week-4/train-any-shape.md
"""
# --8<-- [end:map]
