"""Known-wrong: the projections are split along the head-size axis instead of the head axis:
every rank gets a 1/t slice of EVERY head. The local shapes are the right ones, so nothing
crashes, but each rank's "heads" are fragments and the attention scores come out wrong."""
from tp_from_scratch.layers.attention import causal_attention  # noqa: F401
from tp_from_scratch.layers.attention import parallel_attention_backward, parallel_attention_forward  # noqa: F401


def _split_head_size(w, n, tp, rank, axis):
    # w's `axis` is n heads of hs: view it as (n, hs) and keep slice `rank` of hs
    moved = w if axis == 0 else w.T
    heads = moved.reshape(n, -1, *moved.shape[1:])  # (n, hs, ...)
    hs = heads.shape[1]
    part = heads[:, rank * hs // tp:(rank + 1) * hs // tp].reshape(n * hs // tp, *moved.shape[1:])
    return part if axis == 0 else part.T


def shard_attention_params(params, n_heads, n_kv_heads, tp, rank):
    local = {"o.bias": params["o.bias"].copy()}
    for name, n in (("q", n_heads), ("k", n_kv_heads), ("v", n_kv_heads)):
        local[f"{name}.weight"] = _split_head_size(params[f"{name}.weight"], n, tp, rank, axis=1).copy()
        if name != "k":  # no key bias
            local[f"{name}.bias"] = _split_head_size(params[f"{name}.bias"], n, tp, rank, axis=0).copy()
    local["o.weight"] = _split_head_size(params["o.weight"], n_heads, tp, rank, axis=0).copy()
    return local
