# --8<-- [start:package]
"""tinyscale: the code of the course. One topic per folder, one concept per module.

    core            one process: the model, its data, the training loop, checkpoints
    comm            processes and messages: process groups, launchers, collectives
    data_parallel   DDP, ZeRO, FSDP: every rank trains the whole model on its own data
    model_parallel  pipelines (and, in Week 4, tensor parallelism): each rank holds a part
    low_precision   fp8 and the other formats: scaling, and linear layers that compute in fp8
    compat          DeepSpeed and torchtitan on the course's model
    ops             cluster operations: multi-node launches, probes, hangs, storage

Imports flow one way: core <- comm <- data_parallel, model_parallel <- compat, and
core <- low_precision <- compat; ops may import any of them and nothing imports ops. Import a module by its full name, for example
``from tinyscale.core.model import TinyTransformer``; the folders re-export nothing.
"""
# --8<-- [end:package]
