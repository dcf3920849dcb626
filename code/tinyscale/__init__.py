# --8<-- [start:package]
"""tinyscale: the code of the course. One topic per folder, one concept per module.

    core               one process: the model, its data, the training loop, checkpoints
    comm               processes and messages: process groups, launchers, collectives
    data_parallel      DDP, ZeRO, FSDP: every rank trains the whole model on its own data
    pipeline_parallel  pipelines (Week 3): each rank holds a stage of the model
    expert_parallel    a mixture of experts, its experts spread over ranks (Week 3)
    tensor_parallel    tensor and sequence parallelism (Week 4): each weight split over ranks
    low_precision      fp8 and the other formats: scaling, and linear layers that compute in fp8
    compat             DeepSpeed and torchtitan on the course's model
    ops                cluster operations: multi-node launches, probes, hangs, storage

Imports flow one way: core <- comm <- data_parallel, pipeline_parallel, tensor_parallel,
expert_parallel <- compat, and core <- low_precision <- compat; ops may import any of
them and nothing imports ops. Import a module by its full name, for example
``from tinyscale.core.model import TinyTransformer``; the folders re-export nothing.
"""
# --8<-- [end:package]
