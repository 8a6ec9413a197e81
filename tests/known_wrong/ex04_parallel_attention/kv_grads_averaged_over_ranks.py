"""Known-wrong: the backward averages the KV gradients over all ranks with an extra
all-reduce (as in data parallelism), which is neither needed nor right in tensor parallelism."""
from tp_from_scratch.layers.attention import causal_attention  # noqa: F401
from tp_from_scratch.collectives import all_reduce
from tp_from_scratch.layers.attention import shard_attention_params  # noqa: F401
from tp_from_scratch.layers.reference import linear_backward, linear_forward
from tp_from_scratch.layers.reference import qkv_attention_backward, qkv_attention_forward


def parallel_attention_forward(comm, x, params_local, n_heads, n_kv_heads):
    t = comm.world_size
    o, c_attn = qkv_attention_forward(x, params_local, n_heads // t, max(n_kv_heads // t, 1))
    partial, c_out = linear_forward(o, params_local["o.weight"], None)
    return all_reduce(comm, partial) + params_local["o.bias"], (c_attn, c_out)


def parallel_attention_backward(comm, dy, cache):
    c_attn, c_out = cache
    do, dwo, _ = linear_backward(dy, c_out)
    dx, grads = qkv_attention_backward(do, c_attn)
    for key in ("k.weight", "v.weight", "v.bias"):  # wrong: averaging, and an extra all-reduce per key
        grads[key] = all_reduce(comm, grads[key]) / comm.world_size
    grads.update({"o.weight": dwo, "o.bias": dy.reshape(-1, dy.shape[-1]).sum(axis=0)})
    return all_reduce(comm, dx), grads
