"""Known-wrong: the MLP backward all-reduces the gradient of the sharded hidden activation
between the two layers, as if it were replicated: an extra all-reduce that also adds
unrelated shards together."""
from tp_from_scratch.collectives import all_reduce
from tp_from_scratch.layers.linear import (  # noqa: F401
    column_parallel_linear_backward, column_parallel_linear_forward,
    row_parallel_linear_backward, row_parallel_linear_forward,
)
from tp_from_scratch.layers.mappings import f_backward, f_forward, g_backward, g_forward  # noqa: F401
from tp_from_scratch.layers.reference import gelu_backward, gelu_forward


def parallel_mlp_forward(comm, x, params_local):
    p = params_local
    h, cache1 = column_parallel_linear_forward(comm, x, p["fc.weight"], p["fc.bias"])
    a, cache_gelu = gelu_forward(h)
    y, cache2 = row_parallel_linear_forward(comm, a, p["proj.weight"], p["proj.bias"])
    return y, (cache1, cache_gelu, cache2)


def parallel_mlp_backward(comm, dy, cache):
    cache1, cache_gelu, cache2 = cache
    da, dw2, db2 = row_parallel_linear_backward(comm, dy, cache2)
    da = all_reduce(comm, da)  # wrong: da is Sharded(F), not a partial sum
    dh = gelu_backward(da, cache_gelu)
    dx, dw1, db1 = column_parallel_linear_backward(comm, dh, cache1)
    return dx, {"fc.weight": dw1, "fc.bias": db1, "proj.weight": dw2, "proj.bias": db2}
