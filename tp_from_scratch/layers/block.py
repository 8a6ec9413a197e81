"""The tensor-parallel pre-LayerNorm transformer block: h = x + attn(ln1(x)); y = h + mlp(ln2(h)).

    x   (B, T, H)  Replicated
    ln1             Replicated: every rank normalises the whole x itself (cheap, no communication)
    attn            f ... g: one all-reduce forward, one backward (attention.py)
    h = x + attn    Replicated residual
    ln2             Replicated
    mlp             f ... g: one all-reduce forward, one backward (mlp.py)
    y = h + mlp     Replicated

So a block costs 2 all-reduces forward and 2 backward, each of a (B, T, H) activation. A ring
all-reduce sends 2(t-1)/t of its input per rank, hence per block per step, per rank:
    4 x 2(t-1)/t x B*T*H x itemsize bytes.
LayerNorm weights are Replicated; their gradients come out identical on every rank because
they only see Replicated tensors (the all-reduced activations and their gradients).
Local params, named as in the torch GPT's Block: ln1.weight, ln1.bias, ln2.weight, ln2.bias
(H,), "attn.*" from shard_attention_params, "mlp.*" from shard_mlp_params. The single-device
version is reference.block_forward(x, params, config).
"""
from tp_from_scratch.layers.attention import (
    gather_attention_grads, gather_attention_params, parallel_attention_backward,
    parallel_attention_forward, shard_attention_params)
from tp_from_scratch.layers.linear import replicated_value
from tp_from_scratch.layers.mlp import (
    gather_mlp_params, parallel_mlp_backward, parallel_mlp_forward, shard_mlp_params)
from tp_from_scratch.layers.reference import (  # noqa: F401  (BlockConfig is part of this API)
    BlockConfig, layernorm_backward, layernorm_forward, sub_params)

LAYERNORM_KEYS = ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias")


def parallel_block_forward(comm, x, params_local, config):
    """The block on x (B, T, H) Replicated; 2 all-reduces. Returns (y (B, T, H) Replicated, cache)."""
    p = params_local
    a, c_ln1 = layernorm_forward(x, p["ln1.weight"], p["ln1.bias"])
    att, c_att = parallel_attention_forward(comm, a, sub_params(p, "attn."), config.n_heads,
                                            config.n_kv_heads)
    h = x + att
    m, c_ln2 = layernorm_forward(h, p["ln2.weight"], p["ln2.bias"])
    mlp, c_mlp = parallel_mlp_forward(comm, m, sub_params(p, "mlp."))
    return h + mlp, (c_ln1, c_att, c_ln2, c_mlp)


def parallel_block_backward(comm, dy, cache):
    """Backward of parallel_block_forward for dy (B, T, H) Replicated; 2 all-reduces (one per f).

    Returns (dx (B, T, H) Replicated, grads_local) with the keys of the local params.
    """
    c_ln1, c_att, c_ln2, c_mlp = cache
    dm, g_mlp = parallel_mlp_backward(comm, dy, c_mlp)
    dh_ln, dg2, db2 = layernorm_backward(dm, c_ln2)
    dh = dy + dh_ln  # the residual passes dy straight through
    da, g_att = parallel_attention_backward(comm, dh, c_att)
    dx_ln, dg1, db1 = layernorm_backward(da, c_ln1)
    grads = {"ln1.weight": dg1, "ln1.bias": db1, "ln2.weight": dg2, "ln2.bias": db2}
    grads.update({f"attn.{k}": v for k, v in g_att.items()})
    grads.update({f"mlp.{k}": v for k, v in g_mlp.items()})
    return dh + dx_ln, grads


def shard_block_params(params, config, tp, rank):
    """Rank ``rank``'s local block params from the full ones; ValueError naming any size tp does not divide."""
    local = {k: params[k].copy() for k in LAYERNORM_KEYS}
    attn = shard_attention_params(sub_params(params, "attn."), config.n_heads, config.n_kv_heads, tp, rank)
    local.update({f"attn.{k}": v for k, v in attn.items()})
    local.update({f"mlp.{k}": v for k, v in shard_mlp_params(sub_params(params, "mlp."), tp, rank).items()})
    return local


def _gather(params_local, config, gather_attention):
    full = {k: replicated_value([p[k] for p in params_local], k) for k in LAYERNORM_KEYS}
    attn = gather_attention([sub_params(p, "attn.") for p in params_local],
                            config.n_heads, config.n_kv_heads)
    full.update({f"attn.{k}": v for k, v in attn.items()})
    mlp = gather_mlp_params([sub_params(p, "mlp.") for p in params_local])
    full.update({f"mlp.{k}": v for k, v in mlp.items()})
    return full


def gather_block_params(params_local, config):
    """The full block params from every rank's local params (inverse of shard_block_params)."""
    return _gather(params_local, config, gather_attention_params)


def gather_block_grads(grads_local, config):
    """The full block gradients from every rank's local ones (Replicated KV head copies are summed)."""
    return _gather(grads_local, config, gather_attention_grads)
