"""Known-wrong: with fewer KV heads than ranks, the KV projections are still cut into t
pieces, so each rank gets a fraction of a KV head instead of a full copy of its KV head."""
import numpy as np

from tp_from_scratch.layers.attention import causal_attention  # noqa: F401
from tp_from_scratch.layers.attention import parallel_attention_backward, parallel_attention_forward  # noqa: F401
from tp_from_scratch.layers.attention import shard_attention_params as _correct_shard


def shard_attention_params(params, n_heads, n_kv_heads, tp, rank):
    local = _correct_shard(params, n_heads, n_kv_heads, tp, rank)
    if n_kv_heads < tp:  # wrong: should replicate the whole KV head
        for key in ("k.weight", "v.weight"):
            local[key] = np.array_split(params[key], tp, axis=1)[rank].copy()
        local["v.bias"] = np.array_split(params["v.bias"], tp)[rank].copy()
    return local
