"""The tensor-parallel MLP: column-parallel Linear(H -> F), GeLU, row-parallel Linear(F -> H).

    x (B, T, H)  Replicated
      -> f -> x @ Wfc_i + bfc_i  (B, T, F/t)  Sharded(-1)   W_fc[H, F_t]   no communication
      -> gelu                    (B, T, F/t)  Sharded(-1)   element-wise, so it works on a shard
      -> a_i @ Wproj_i           (B, T, H)    Partial       W_proj[F_t, H]
      -> g -> + b_proj           (B, T, H)    Replicated    one all-reduce

Forward: one all-reduce (g). Backward: one all-reduce (f). GeLU is the tanh approximation
(see reference.gelu_forward). Local params, named as in the torch GPT's MLP (weights in the
math layout (in, out)): fc.weight (H, F/t), fc.bias (F/t,), proj.weight (F/t, H), proj.bias (H,).
The single-device version is reference.mlp_forward(x, params).
"""
import numpy as np

from tp_from_scratch.layers.linear import (
    column_parallel_linear_backward, column_parallel_linear_forward, replicated_value,
    row_parallel_linear_backward, row_parallel_linear_forward, shard_column_parallel_linear,
    shard_row_parallel_linear)
from tp_from_scratch.layers.reference import gelu_backward, gelu_forward


def parallel_mlp_forward(comm, x, params_local):
    """y = row(gelu(column(x))) for x (B, T, H) Replicated; one all-reduce (g). Returns (y, cache)."""
    p = params_local
    a, c1 = column_parallel_linear_forward(comm, x, p["fc.weight"], p["fc.bias"])      # (B, T, F/t)
    h, cg = gelu_forward(a)                                                           # (B, T, F/t)
    y, c2 = row_parallel_linear_forward(comm, h, p["proj.weight"], p["proj.bias"])   # (B, T, H)
    return y, (c1, cg, c2)


def parallel_mlp_backward(comm, dy, cache):
    """Backward of parallel_mlp_forward for dy (B, T, H) Replicated; one all-reduce (f, in the column layer).

    Returns (dx (B, T, H) Replicated, grads_local) with the keys of the local params;
    proj.bias's gradient is the full one, identical on every rank.
    """
    c1, cg, c2 = cache
    dh, dw_proj, db_proj = row_parallel_linear_backward(comm, dy, c2)   # dh (B, T, F/t)
    da = gelu_backward(dh, cg)
    dx, dw_fc, db_fc = column_parallel_linear_backward(comm, da, c1)
    return dx, {"fc.weight": dw_fc, "fc.bias": db_fc, "proj.weight": dw_proj, "proj.bias": db_proj}


def shard_mlp_params(params, tp, rank):
    """Rank ``rank``'s local MLP params from the full ones: F is split into tp contiguous blocks.

    Raises a ValueError naming the quantity when tp does not divide the ffn size.
    """
    w_fc, b_fc = shard_column_parallel_linear(params["fc.weight"], params["fc.bias"], tp, rank, "ffn size")
    w_proj, b_proj = shard_row_parallel_linear(params["proj.weight"], params["proj.bias"], tp, rank, "ffn size")
    return {"fc.weight": w_fc, "fc.bias": b_fc, "proj.weight": w_proj, "proj.bias": b_proj}


def gather_mlp_params(params_local):
    """The full MLP params from the list of every rank's local params (inverse of shard_mlp_params).

    Also gathers gradients (same keys): proj.bias's copies must be equal, and are checked to be.
    """
    def every(key):
        return [p[key] for p in params_local]

    return {
        "fc.weight": np.concatenate(every("fc.weight"), axis=1),                 # (H, F)
        "fc.bias": np.concatenate(every("fc.bias")),                             # (F,)
        "proj.weight": np.concatenate(every("proj.weight"), axis=0),             # (F, H)
        "proj.bias": replicated_value(every("proj.bias"), "proj.bias"),          # (H,)
    }
