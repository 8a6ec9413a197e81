"""The tensor-parallel MLP: column-parallel Linear(H -> F), GeLU, row-parallel Linear(F -> H).

    x (B, T, H)  Replicated
      -> f -> x @ W1_i + b1_i   (B, T, F/t)  Sharded(-1)   W1[H, F_t]   no communication
      -> gelu                   (B, T, F/t)  Sharded(-1)   element-wise, so it works on a shard
      -> a_i @ W2_i             (B, T, H)    Partial       W2[F_t, H]
      -> g -> + b2              (B, T, H)    Replicated    one all-reduce

Forward: one all-reduce (g). Backward: one all-reduce (f). GeLU is the tanh approximation
(see reference.gelu_forward). Local params: w1 (H, F/t), b1 (F/t,), w2 (F/t, H), b2 (H,).
"""
import numpy as np

from tp_from_scratch.layers.linear import (
    column_parallel_linear_backward, column_parallel_linear_forward, replicated_value,
    row_parallel_linear_backward, row_parallel_linear_forward, shard_column_parallel_linear,
    shard_row_parallel_linear)
from tp_from_scratch.layers.reference import gelu_backward, gelu_forward


def mlp_forward(comm, x, params_local):
    """y = row(gelu(column(x))) for x (B, T, H) Replicated; one all-reduce. Returns (y, cache)."""
    a, c1 = column_parallel_linear_forward(comm, x, params_local["w1"], params_local["b1"])  # (B, T, F/t)
    h, cg = gelu_forward(a)                                                               # (B, T, F/t)
    y, c2 = row_parallel_linear_forward(comm, h, params_local["w2"], params_local["b2"])   # (B, T, H)
    return y, (c1, cg, c2)


def mlp_backward(comm, dy, cache):
    """Backward of mlp_forward for dy (B, T, H) Replicated; one all-reduce (f, inside the column layer).

    Returns (dx (B, T, H) Replicated, grads_local) with the keys of the local params;
    b2's gradient is the full one, identical on every rank.
    """
    c1, cg, c2 = cache
    dh, dw2, db2 = row_parallel_linear_backward(comm, dy, c2)   # dh (B, T, F/t)
    da = gelu_backward(dh, cg)
    dx, dw1, db1 = column_parallel_linear_backward(comm, da, c1)
    return dx, {"w1": dw1, "b1": db1, "w2": dw2, "b2": db2}


def shard_mlp_params(params, tp, rank):
    """Rank ``rank``'s local MLP params from the full ones: F is split into tp contiguous blocks.

    Raises a ValueError naming the quantity when tp does not divide the ffn size.
    """
    w1, b1 = shard_column_parallel_linear(params["w1"], params["b1"], tp, rank, "ffn size")
    w2, b2 = shard_row_parallel_linear(params["w2"], params["b2"], tp, rank, "ffn size")
    return {"w1": w1, "b1": b1, "w2": w2, "b2": b2}


def gather_mlp_params(params_local):
    """The full MLP params from the list of every rank's local params (inverse of shard_mlp_params).

    Also gathers gradients (same keys): b2's copies must be equal, and are checked to be.
    """
    return {
        "w1": np.concatenate([p["w1"] for p in params_local], axis=1),  # (H, F)
        "b1": np.concatenate([p["b1"] for p in params_local]),          # (F,)
        "w2": np.concatenate([p["w2"] for p in params_local], axis=0),  # (F, H)
        "b2": replicated_value([p["b2"] for p in params_local], "b2"),  # (H,)
    }

