"""Known-wrong: shard_attention_params hands every rank the full params' o.bias itself (not a copy).

Updating one rank's replicated bias in place would change the full params and every other rank's.
"""
from tp_from_scratch.layers.attention import causal_attention, parallel_attention_backward  # noqa: F401
from tp_from_scratch.layers.attention import parallel_attention_forward  # noqa: F401
from tp_from_scratch.layers.attention import shard_attention_params as _shard


def shard_attention_params(params, n_heads, n_kv_heads, tp, rank):
    local = _shard(params, n_heads, n_kv_heads, tp, rank)
    local["o.bias"] = params["o.bias"]  # wrong: an alias of the caller's array
    return local
