# --8<-- [start:formula]
"""FLOPs of a training step, counted on paper from the model's shape: 6 N + 12 L T d per token.

Try it:  python -c "from tinyscale.core.flops import flops_per_token as f; from tinyscale.core.config import preset; print(f(preset('lab'), 64))"

One formula for every lesson that needs it: the MFU of workflows.mfu (checked there
against torch's FlopCounterMode) and the compute time of composed.planner.
"""

from tinyscale.core.config import ModelConfig


def matmul_weights(cfg: ModelConfig) -> int:
    """N: the weights that multiply activations in a matmul, each token once.

    Per block q, k, v and the output projection (4 d^2) and the MLP (2 d i); then the head
    (V d), the tied embedding matrix used as a matmul. Left out: the embedding *lookups*
    (no arithmetic), biases and LayerNorms (d numbers each, not d^2).
    """
    d, i, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    return L * (4 * d * d + 2 * d * i) + V * d


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Forward + backward FLOPs per token: 6 N + 12 L T d.

    6 N: a matmul costs 2 FLOPs per weight per token (multiply, add) in the forward, and
    twice that in the backward (the gradient of the input and of the weight). 12 L T d:
    attention's two T x T matmuls (q k^T, then the weights times v) cost 2 T d each per
    token and layer forward, 4 T d backward; counted over the whole T x T square, the way
    the math kernel computes it, although causal attention needs only half of it.
    """
    return 6 * matmul_weights(cfg) + 12 * cfg.num_hidden_layers * seq_len * cfg.hidden_size


# --8<-- [end:formula]
