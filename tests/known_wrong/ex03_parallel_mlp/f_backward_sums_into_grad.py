"""Known-wrong: f's backward writes the all-reduced sum into the caller's gradient array and returns it."""
from tp_from_scratch.collectives import all_reduce
from tp_from_scratch.layers.linear import (column_parallel_linear_backward, column_parallel_linear_forward,  # noqa: F401
                                           row_parallel_linear_backward, row_parallel_linear_forward)
from tp_from_scratch.layers.mappings import f_forward, g_backward, g_forward  # noqa: F401
from tp_from_scratch.layers.mlp import parallel_mlp_backward, parallel_mlp_forward  # noqa: F401


def f_backward(comm, grad):
    grad[...] = all_reduce(comm, grad)  # wrong: the caller's grad now holds the sum
    return grad
