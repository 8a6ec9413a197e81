"""Lesson 1: one matmul Y = X @ W split across t devices, two ways.

Shapes: X (B, H) with B rows of input, W (H, F); t devices.

Column parallel: W[H, F_t]. Device i holds the column block W_i (H, F/t) and a full
copy of X, and computes Y_i = X @ W_i (B, F/t): a column block of Y. Concatenating
the blocks gives Y. Every element of Y is one dot product done on one device, so the
result is bit-exact.

Row parallel: X[B, H_t] and W[H_t, F]. Device i holds X_i (B, H/t) and the row block
W_i (H/t, F), and computes X_i @ W_i (B, F): a *partial sum* of Y of full shape.
Adding the t partial sums gives Y, but in a different summation order than one long
dot product, so the result matches only up to rounding (see tp_from_scratch.compare).

There is no communication here yet: the shards are an explicit Python list, one entry
per device. Next, "concatenate" becomes all_gather and "add" all_reduce: collectives.
"""
import numpy as np


def matmul_reference(x, w):
    """Single-device reference: Y = X @ W, (B, H) @ (H, F) -> (B, F)."""
    return x @ w


def column_parallel_matmul(x, w_shards):
    """Device i computes X @ W_i -> Y_i, a column block of Y.

    x: (B, H), replicated on every device. w_shards: t blocks of shape (H, F/t).
    Returns the t output blocks, each (B, F/t); ``unshard(blocks, axis=-1)`` is Y.
    """
    return [x @ w_i for w_i in w_shards]  # (B, H) @ (H, F/t) -> (B, F/t)


def row_parallel_matmul(x_shards, w_shards):
    """Device i computes X_i @ W_i -> a partial sum of Y (full shape).

    x_shards: t column blocks of X, each (B, H/t). w_shards: t row blocks of W, each (H/t, F).
    Returns t partial sums, each (B, F); ``sum_partials(partials)`` is Y.
    """
    if len(x_shards) != len(w_shards):
        raise ValueError(f"got {len(x_shards)} shards of X but {len(w_shards)} shards of W")
    return [x_i @ w_i for x_i, w_i in zip(x_shards, w_shards)]  # (B, H/t) @ (H/t, F) -> (B, F)


def sum_partials(partials):
    """Add the partial sums in rank order: what an all-reduce (sum) computes on every device."""
    total = partials[0].copy()
    for p in partials[1:]:
        total += p
    return total


def shard_memory(shapes, itemsize):
    """Bytes one device holds for a list of array shapes (for the memory tables in the lessons)."""
    return int(sum(np.prod(s) for s in shapes)) * itemsize
