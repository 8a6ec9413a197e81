"""Parameters of the numpy CAAT block stack: sharding and gathering of layers.reference's block.

Names are the torch GPT's (Lesson 5), weights stored (in, out) as everywhere in numpy:

    ln1.weight, ln1.bias                         (H,)             Replicated
    attn.q.weight (H, nh*hs), attn.q.bias        column-parallel by query heads
    attn.k.weight (H, nkv*hs), no bias           column-parallel by KV heads
    attn.v.weight (H, nkv*hs), attn.v.bias       column-parallel by KV heads
    attn.o.weight (nh*hs, H)                     row-parallel
    attn.o.bias (H,)                             Replicated
    ln2.weight, ln2.bias                         (H,)             Replicated
    mlp.fc.weight (H, F), mlp.fc.bias (F,)       column-parallel
    mlp.proj.weight (F, H)                       row-parallel
    mlp.proj.bias (H,)                           Replicated

The Replicated ones are the parameters CAAT applies to t different streams: their gradients
are summed over the TP group (REPLICATED_KEYS). KV heads are split, never copied: t must
divide both the number of query heads and of KV heads.
"""
import numpy as np

from tp_from_scratch.layers import reference as ref
from tp_from_scratch.layers.linear import replicated_value
from tp_from_scratch.sharding import check_divisible

REPLICATED_KEYS = ("ln1.weight", "ln1.bias", "attn.o.bias", "ln2.weight", "ln2.bias", "mlp.proj.bias")


def init_stack_params(rng, config, n_blocks, dtype=np.float64):
    """Random full params for n_blocks blocks of ``config`` (a layers.BlockConfig): a list of dicts."""
    return [ref.init_block_params(rng, config, dtype) for _ in range(n_blocks)]


def sharded_layout(config, t):
    """{key: (axis, size of the whole axis)} for every sharded parameter; None for Replicated ones."""
    check_divisible(config.n_heads, t, "number of heads")
    check_divisible(config.n_kv_heads, t, "number of KV heads")
    check_divisible(config.ffn, t, "ffn size")
    q, kv = config.n_heads * config.head_size, config.n_kv_heads * config.head_size
    return {"attn.q.weight": (1, q), "attn.q.bias": (0, q), "attn.k.weight": (1, kv),
            "attn.v.weight": (1, kv), "attn.v.bias": (0, kv), "attn.o.weight": (0, q),
            "mlp.fc.weight": (1, config.ffn), "mlp.fc.bias": (0, config.ffn),
            "mlp.proj.weight": (0, config.ffn)}


def shard_block_params(params, config, t, rank):
    """Rank ``rank``'s local params of one block: contiguous heads and ffn columns; copies."""
    if not 0 <= rank < t:
        raise ValueError(f"rank {rank} does not exist for tp={t}")
    local = {}
    for key, value in params.items():
        axis_size = sharded_layout(config, t).get(key)
        if axis_size is None:
            local[key] = value.copy()
            continue
        axis, size = axis_size
        n = size // t
        local[key] = np.take(value, np.arange(rank * n, (rank + 1) * n), axis=axis)
    return local


def gather_block_grads(grads_local, config):
    """Full gradients of one block from every rank's local ones (Replicated copies must agree)."""
    layout = sharded_layout(config, len(grads_local))
    full = {}
    for key in grads_local[0]:
        copies = [g[key] for g in grads_local]
        if key in layout:
            full[key] = np.concatenate(copies, axis=layout[key][0])
        else:
            full[key] = replicated_value(copies, key)
    return full
