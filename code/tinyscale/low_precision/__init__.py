# --8<-- [start:map]
"""tinyscale.low_precision: fewer bits per number, and how training survives them.

Formats from fp32 down to fp8, the scaling that fits a tensor into fp8's range, and a
linear layer whose matmuls run in fp8 (Week 3). They import tinyscale.core only.

    module              taught on
    formats             week-3/fp8.md
    scaling             week-3/fp8.md
    float8_linear       week-3/fp8.md
    compare             week-3/fp8.md
"""
# --8<-- [end:map]
