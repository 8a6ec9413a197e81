"""Known-wrong: the column-parallel backward returns this rank's partial dx = dy_local @ w_shard.T
without summing it over the ranks (f's all-reduce is missing)."""
from tp_from_scratch.layers.linear import row_parallel_linear_backward, row_parallel_linear_forward  # noqa: F401
from tp_from_scratch.layers.mappings import f_backward, f_forward, g_backward, g_forward  # noqa: F401
from tp_from_scratch.layers.mlp import parallel_mlp_backward, parallel_mlp_forward  # noqa: F401


def column_parallel_linear_forward(comm, x, w_shard, b_shard):
    return x @ w_shard + b_shard, (x, w_shard)


def column_parallel_linear_backward(comm, dy_local, cache):
    x, w_shard = cache
    dx = dy_local @ w_shard.T  # wrong: only this rank's share of dx
    dw_shard = x.reshape(-1, x.shape[-1]).T @ dy_local.reshape(-1, dy_local.shape[-1])
    return dx, dw_shard, dy_local.reshape(-1, dy_local.shape[-1]).sum(axis=0)
