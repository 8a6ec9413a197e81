"""Known-wrong: the row-parallel layer adds the bias on every rank BEFORE the all-reduce,
so y gets t copies of b (right only at t=1)."""
from tp_from_scratch.collectives import all_reduce
from tp_from_scratch.layers.linear import column_parallel_linear_backward, column_parallel_linear_forward  # noqa: F401
from tp_from_scratch.layers.mappings import f_backward, f_forward, g_backward, g_forward  # noqa: F401
from tp_from_scratch.layers.mlp import parallel_mlp_backward, parallel_mlp_forward  # noqa: F401


def row_parallel_linear_forward(comm, x_local, w_shard, b):
    y = all_reduce(comm, x_local @ w_shard + b)  # wrong: every rank's partial carries b
    return y, (x_local, w_shard)


def row_parallel_linear_backward(comm, dy, cache):
    x_local, w_shard = cache
    dx_local = dy @ w_shard.T
    dw_shard = x_local.reshape(-1, x_local.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])
    return dx_local, dw_shard, dy.reshape(-1, dy.shape[-1]).sum(axis=0)
