# --8<-- [start:map]
"""tinyscale.expert_parallel: a mixture of experts, its experts spread over ranks (Week 3).

A mixture of experts splits the FFN into experts and routes each token to a few of them;
expert parallelism puts the experts on different ranks and sends each token to its
experts' ranks with an all-to-all. They import tinyscale.core and tinyscale.comm only.

    module              taught on
    moe_routing         week-3/moe.md
    moe                 week-3/moe.md
    moe_compare         week-3/moe.md
    ep_moe              week-3/moe.md
"""
# --8<-- [end:map]
