"""Known-wrong: g averages the partial sums instead of adding them (right only at t=1)."""
from tp_from_scratch.collectives import all_reduce
from tp_from_scratch.layers.linear import (  # noqa: F401
    column_parallel_linear_backward, column_parallel_linear_forward,
    row_parallel_linear_backward, row_parallel_linear_forward,
)
from tp_from_scratch.layers.mappings import f_backward, f_forward, g_backward  # noqa: F401
from tp_from_scratch.layers.mlp import parallel_mlp_backward, parallel_mlp_forward  # noqa: F401


def g_forward(comm, x):
    return all_reduce(comm, x) / comm.world_size  # wrong: a mean, not a sum
