"""Known-wrong: the output projection adds bo on every rank before the all-reduce, so y
carries t copies of the bias."""
from tp_from_scratch.layers.attention import causal_attention  # noqa: F401
from tp_from_scratch.collectives import all_reduce
from tp_from_scratch.layers.attention import shard_attention_params  # noqa: F401
from tp_from_scratch.layers.reference import linear_backward, linear_forward
from tp_from_scratch.layers.reference import qkv_attention_backward, qkv_attention_forward


def parallel_attention_forward(comm, x, params_local, n_heads, n_kv_heads):
    t = comm.world_size
    o, c_attn = qkv_attention_forward(x, params_local, n_heads // t, max(n_kv_heads // t, 1))
    partial, c_out = linear_forward(o, params_local["o.weight"], params_local["o.bias"])  # wrong: bias t times
    return all_reduce(comm, partial), (c_attn, c_out)


def parallel_attention_backward(comm, dy, cache):
    c_attn, c_out = cache
    do, dwo, dbo = linear_backward(dy, c_out)
    dx, grads = qkv_attention_backward(do, c_attn)
    grads.update({"o.weight": dwo, "o.bias": dbo})
    return all_reduce(comm, dx), grads
