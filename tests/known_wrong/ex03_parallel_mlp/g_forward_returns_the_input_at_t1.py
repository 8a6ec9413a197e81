"""Known-wrong: g's forward skips the all-reduce at t = 1 (allowed) but returns the partial
sum itself instead of a new array, so writing into the output changes the input."""
from tp_from_scratch.layers.linear import *  # noqa: F401,F403
from tp_from_scratch.layers.mappings import f_backward, f_forward, g_backward  # noqa: F401
from tp_from_scratch.layers.mappings import g_forward as _g_forward
from tp_from_scratch.layers.mlp import parallel_mlp_backward, parallel_mlp_forward  # noqa: F401


def g_forward(comm, x):
    return x if comm.world_size == 1 else _g_forward(comm, x)
