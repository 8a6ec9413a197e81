"""Known-wrong: the row-parallel layer adds b/t on every rank before the all-reduce.

The t copies of b/t add up to b, so float results look right; on integer-valued data
(b/3 is not exact) the output is off by rounding, where every correct order is exact.
"""
from tp_from_scratch.collectives import all_reduce
from tp_from_scratch.layers.linear import column_parallel_linear_backward, column_parallel_linear_forward  # noqa: F401
from tp_from_scratch.layers.linear import row_parallel_linear_backward  # noqa: F401
from tp_from_scratch.layers.mappings import f_backward, f_forward, g_backward, g_forward  # noqa: F401
from tp_from_scratch.layers.mlp import parallel_mlp_backward, parallel_mlp_forward  # noqa: F401
from tp_from_scratch.layers.reference import linear_forward


def row_parallel_linear_forward(comm, x_local, w_shard, b):
    partial, cache = linear_forward(x_local, w_shard, b / comm.world_size)
    return all_reduce(comm, partial), (cache, True)
