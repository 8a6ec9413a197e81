"""Column- and row-parallel linear layers whose outer side is sequence-sharded (Megatron's sequence_parallel=True).

Lesson 3's pair, with the region mappings swapped for the sequence-parallel ones:

    column:  x_r (B, T_r, H) Sharded(1) --g: all-gather(T)--> x (B, T, H) --@ W_i + b_i-->
             (B, T, out/t) Sharded(-1)
    row:     x_i (B, T, in/t) Sharded(-1) --@ W_i--> (B, T, out) Partial
             --g-bar: reduce-scatter(T)--> (B, T_r, out) Sharded(1) --+ b--> y_r

Weights are sharded exactly as in Lesson 3 (same shards, same checkpoint). The row bias is
added to this rank's positions only, so the sum of dy over those positions would be a Partial
gradient; but backward all-gathers dy along T anyway (g-bar backward), so the full bias
gradient is summed from the gathered dy, with no extra communication. (Autograd cannot see
that: the torch layer in ``sequence_parallel.nn`` all-reduces it, as Megatron-LM does.)
"""
from tp_from_scratch.layers.reference import linear_backward, linear_forward
from tp_from_scratch.sequence_parallel.mappings import (
    gather_from_sequence_parallel_region_backward, gather_from_sequence_parallel_region_forward,
    reduce_scatter_to_sequence_parallel_region_backward,
    reduce_scatter_to_sequence_parallel_region_forward)


def sequence_parallel_column_linear_forward(comm, x_shard, w_shard, b_shard):
    """Y_i = g(x_r) @ W_i + b_i: all-gather along T forward. Returns (y_local (B, T, out/t), cache).

    x_shard (B, T_r, in) Sharded(1); w_shard (in, out/t); b_shard (out/t,) or None.
    """
    x = gather_from_sequence_parallel_region_forward(comm, x_shard)  # (B, T, in) Replicated
    return linear_forward(x, w_shard, b_shard)


def sequence_parallel_column_linear_backward(comm, dy_local, cache):
    """Backward: reduce-scatter along T of the Partial dx. Returns (dx_shard (B, T_r, in), dw_shard, db_shard).

    dw and db of a column block need no communication: they only involve this rank's columns,
    and the forward saw every position.
    """
    dx_partial, dw_shard, db_shard = linear_backward(dy_local, cache)  # dx: (B, T, in) Partial
    return gather_from_sequence_parallel_region_backward(comm, dx_partial), dw_shard, db_shard


def sequence_parallel_row_linear_forward(comm, x_local, w_shard, b):
    """y_r = g-bar(x_i @ W_i) + b: reduce-scatter along T forward. Returns (y_shard (B, T_r, out), cache).

    x_local (B, T, in/t) Sharded(-1); w_shard (in/t, out); b (out,) Replicated or None.
    """
    partial, cache = linear_forward(x_local, w_shard, None)                # (B, T, out) Partial
    y = reduce_scatter_to_sequence_parallel_region_forward(comm, partial)  # (B, T_r, out)
    if b is not None:
        y = y + b
    return y, (cache, b is not None)


def sequence_parallel_row_linear_backward(comm, dy_shard, cache):
    """Backward: all-gather of dy along T; the bias gradient comes from the gathered dy.

    dy_shard (B, T_r, out). Returns (dx_local (B, T, in/t), dw_shard (in/t, out), db (out,) or None);
    db is the full bias gradient, identical on every rank.
    """
    linear_cache, has_bias = cache
    dy = reduce_scatter_to_sequence_parallel_region_backward(comm, dy_shard)  # (B, T, out)
    dx_local, dw_shard, _ = linear_backward(dy, linear_cache)
    # every position's dy is here now: the whole bias gradient, the same on every rank
    db = dy.reshape(-1, dy.shape[-1]).sum(axis=0) if has_bias else None
    return dx_local, dw_shard, db
