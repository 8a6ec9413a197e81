"""Column-parallel and row-parallel linear layers, Y = X @ W + b with W (in, out).

Column-parallel, W[in, out_t]: rank i holds the column block W_i (in, out/t) and b_i.
    x (Replicated) -> f -> x @ W_i + b_i = Y_i, Sharded(-1): a column block of Y.
Row-parallel, W[in_t, out]: rank i holds the row block W_i (in/t, out); b is Replicated.
    x_i (Sharded(-1)) -> x_i @ W_i (Partial) -> g -> Y (Replicated) -> + b.
    The bias is added once, AFTER the reduction: added before it, it would be counted t times.

Column then row needs no communication in between: the column layer's Sharded output is
exactly the input the row layer wants. That is why the MLP costs one all-reduce each way.
"""
import numpy as np

from tp_from_scratch.layers.mappings import f_backward, f_forward, g_backward, g_forward
from tp_from_scratch.layers.reference import linear_backward, linear_forward
from tp_from_scratch.sharding import check_divisible, shard_range


def column_parallel_linear_forward(comm, x, w_shard, b_shard):
    """Y_i = f(x) @ W_i + b_i, this rank's column block of Y. No communication forward.

    x (..., in) Replicated; w_shard (in, out/t); b_shard (out/t,) or None.
    Returns (y_local (..., out/t), cache).
    """
    y_local, cache = linear_forward(f_forward(comm, x), w_shard, b_shard)
    return y_local, cache


def column_parallel_linear_backward(comm, dy_local, cache):
    """Gradients of the column-parallel layer: one all-reduce (f backward) for dx.

    dy_local (..., out/t). Returns (dx (..., in) Replicated, dw_shard (in, out/t), db_shard (out/t,)).
    dw and db of a column block only involve that block, so they need no communication.
    """
    dx_partial, dw_shard, db_shard = linear_backward(dy_local, cache)  # dx_partial: Partial
    return f_backward(comm, dx_partial), dw_shard, db_shard


def row_parallel_linear_forward(comm, x_local, w_shard, b):
    """Y = g(x_i @ W_i) + b: all-reduce forward, bias added once after it.

    x_local (..., in/t) Sharded(-1); w_shard (in/t, out); b (out,) Replicated or None.
    Returns (y (..., out) Replicated, cache).
    """
    partial, cache = linear_forward(x_local, w_shard, None)  # (..., out), Partial
    y = g_forward(comm, partial)
    if b is not None:
        y = y + b
    return y, (cache, b is not None)


def row_parallel_linear_backward(comm, dy, cache):
    """Gradients of the row-parallel layer: no communication (g backward is the identity).

    dy (..., out) Replicated. Returns (dx_local (..., in/t), dw_shard (in/t, out), db (out,)).
    db is the full bias gradient, identical on every rank (dy is Replicated).
    """
    linear_cache, has_bias = cache
    dpartial = g_backward(comm, dy)
    dx_local, dw_shard, _ = linear_backward(dpartial, linear_cache)
    db = dy.reshape(-1, dy.shape[-1]).sum(axis=0) if has_bias else None
    return dx_local, dw_shard, db


def shard_column_parallel_linear(w, b, tp, rank, what="output features"):
    """Rank ``rank``'s column block (W_i (in, out/t), b_i (out/t,)) of a full W (in, out), b (out,)."""
    check_divisible(w.shape[1], tp, what)
    check_rank(rank, tp)
    cols = slice(*shard_range(w.shape[1], rank, tp))
    return w[:, cols].copy(), (None if b is None else b[cols].copy())


def shard_row_parallel_linear(w, b, tp, rank, what="input features"):
    """Rank ``rank``'s row block W_i (in/t, out) of a full W (in, out); b (out,) stays whole."""
    check_divisible(w.shape[0], tp, what)
    check_rank(rank, tp)
    rows = slice(*shard_range(w.shape[0], rank, tp))
    return w[rows].copy(), (None if b is None else b.copy())


def check_rank(rank, tp):
    """Raise a ValueError unless 0 <= rank < tp."""
    if not 0 <= rank < tp:
        raise ValueError(f"rank {rank} does not exist for tp={tp}")


def replicated_value(copies, name):
    """The common value of a Replicated tensor's per-rank copies; a ValueError if any copy differs.

    Replicated tensors (a row-parallel bias, LayerNorm weights, their gradients) are computed
    by the same operations on the same data on every rank, so the copies must agree bit for bit.
    """
    first = copies[0]
    for rank, copy in enumerate(copies[1:], start=1):
        if not np.array_equal(first, copy):
            raise ValueError(f"replicated {name} differs between rank 0 and rank {rank}")
    return first.copy()
