"""Known-wrong: f all-reduces in forward too. Dividing by t makes the numbers right (the
average of t identical copies is the copy), so only the meter can catch the wasted all-reduce."""
from tp_from_scratch.collectives import all_reduce
from tp_from_scratch.layers.linear import (  # noqa: F401
    column_parallel_linear_backward, column_parallel_linear_forward,
    row_parallel_linear_backward, row_parallel_linear_forward,
)
from tp_from_scratch.layers.mappings import f_backward, g_backward, g_forward  # noqa: F401
from tp_from_scratch.layers.mlp import parallel_mlp_backward, parallel_mlp_forward  # noqa: F401


def f_forward(comm, x):
    return all_reduce(comm, x) / comm.world_size  # wrong: x is already replicated
