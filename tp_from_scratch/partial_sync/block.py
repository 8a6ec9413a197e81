"""The CAAT block stack under tensor parallelism: one stream per rank, partial reduces only.

    x (B, T, H)  Replicated (the embedding output)
      -> f                          once, at the entry: identity forward, all-reduce backward
    per block, on this rank's stream x_i (B, T, H):
      ln1(x_i) -> this rank's heads -> o_i @ Wo_i      Partial (no f in front: x_i is ours)
      -> partial reduce + bo       channels [:k] Replicated, [k:] Private (times sqrt(t))
      h_i = x_i + ...
      ln2(h_i) -> gelu(. @ W1_i + b1_i) @ W2_i        Partial
      -> partial reduce + b2
      y_i = h_i + ...               this rank's stream, handed to the next block
    gradients of the Replicated parameters (LayerNorms, bo, b2): all-reduced (summed) at the end

Per block, forward: 2 all-reduces of (B, T, k) instead of 2 of (B, T, H); backward the same,
plus one all-reduce of the entry's dx and one small all-reduce of the Replicated gradients
for the whole stack. At p = 1 this is Lesson 4's block with the f moved out of the layers.
"""
from tp_from_scratch.layers.mappings import f_backward, f_forward
from tp_from_scratch.layers.reference import layernorm_backward, layernorm_forward
from tp_from_scratch.partial_sync.local import (
    attention_partial_backward, attention_partial_forward, mlp_partial_backward, mlp_partial_forward)
from tp_from_scratch.partial_sync.mappings import (
    partial_reduce_backward, partial_reduce_forward, sum_replicated_grads)
from tp_from_scratch.partial_sync.params import REPLICATED_KEYS, check_whole_kv_heads


def _bias_grad(dy):
    return dy.reshape(-1, dy.shape[-1]).sum(axis=0)


def parallel_block_forward(comm, x, local, config, p):
    """One CAAT block on this rank's stream x (B, T, H): 2 partial reduces. Returns (y, cache)."""
    t = comm.world_size
    a, c_ln1 = layernorm_forward(x, local["ln1.weight"], local["ln1.bias"])
    att, c_att = attention_partial_forward(a, local, config.n_heads // t, config.n_kv_heads // t)
    h = x + partial_reduce_forward(comm, att, p) + local["attn.o.bias"]
    m, c_ln2 = layernorm_forward(h, local["ln2.weight"], local["ln2.bias"])
    mlp, c_mlp = mlp_partial_forward(m, local)
    y = h + partial_reduce_forward(comm, mlp, p) + local["mlp.proj.bias"]
    return y, (p, c_ln1, c_att, c_ln2, c_mlp)


def parallel_block_backward(comm, dy, cache):
    """Backward of parallel_block_forward for dy (B, T, H), this stream's gradient: 2 partial reduces.

    Returns (dx (B, T, H) of this stream, local grads). The Replicated parameters' gradients
    cover this stream only: parallel_stack_backward sums them over the ranks.
    """
    p, c_ln1, c_att, c_ln2, c_mlp = cache
    dm, grads = mlp_partial_backward(partial_reduce_backward(comm, dy, p), c_mlp)
    grads["mlp.proj.bias"] = _bias_grad(dy)
    dh_ln, grads["ln2.weight"], grads["ln2.bias"] = layernorm_backward(dm, c_ln2)
    dh = dy + dh_ln  # the residual passes dy straight through
    da, g_att = attention_partial_backward(partial_reduce_backward(comm, dh, p), c_att)
    grads.update(g_att)
    grads["attn.o.bias"] = _bias_grad(dh)
    dx_ln, grads["ln1.weight"], grads["ln1.bias"] = layernorm_backward(da, c_ln1)
    return dh + dx_ln, grads


def parallel_stack_forward(comm, x, locals_, config, p):
    """f at the entry, then every block on this rank's stream. x (B, T, H) Replicated.

    Returns (y (B, T, H) this rank's final stream, cache). ``locals_``: each block's
    layers.block.shard_block_params for this rank; every rank holds KV heads of its own.
    """
    check_whole_kv_heads(config, comm.world_size)
    y = f_forward(comm, x)
    caches = []
    for local in locals_:
        y, cache = parallel_block_forward(comm, y, local, config, p)
        caches.append(cache)
    return y, caches


def parallel_stack_backward(comm, dy, caches):
    """Backward of parallel_stack_forward for dy (B, T, H), this stream's gradient.

    Returns (dx (B, T, H) Replicated: f backward all-reduces it, list of local grads per
    block, with the Replicated parameters' gradients summed over the ranks).
    """
    grads = []
    for cache in reversed(caches):
        dy, g = parallel_block_backward(comm, dy, cache)
        grads.append(g)
    grads.reverse()
    return f_backward(comm, dy), [sum_replicated_grads(comm, g, REPLICATED_KEYS) for g in grads]
