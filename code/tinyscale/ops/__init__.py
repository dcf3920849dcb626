# --8<-- [start:map]
"""tinyscale.ops: running jobs on a real cluster, and finding out what went wrong.

The Operations pages, Lab 3, the Kubernetes page and (a live hang, read with py-spy) the
Profiling page teach these. They may import any part of tinyscale; no part of tinyscale
imports them.

    module          taught on
    multinode       workshop/lab-3.md
    agents          workshop/lab-3.md
    log_merge       workshop/lab-3.md
    k8s_check       workshop/kubernetes.md
    gpu_probe       operations/gpu-stack.md
    gpu_compat      operations/gpu-stack.md
    allocator       operations/gpu-memory.md
    fragmentation   operations/gpu-memory.md
    nccl_env        operations/nccl-network.md
    hangs           operations/hangs.md
    live_hang       workflows/profiling.md
    large_batch     operations/large-batch.md
    storage         operations/storage.md
"""
# --8<-- [end:map]
