"""Parameters of the numpy CAAT block stack: layers.reference's block, cut by Lesson 4's rules.

Names are the torch GPT's (Lesson 5), weights stored (in, out) as everywhere in numpy. They are
sharded and gathered by Lesson 4's ``layers.block.shard_block_params`` / ``gather_block_grads``
(contiguous heads and ffn columns), with one rule more: every rank holds whole KV heads of its
own (``check_whole_kv_heads``), since each stream reads its own KV heads and never shares them.

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
are summed over the TP group (REPLICATED_KEYS). Which axis each split parameter is cut on is
the GPT's sharding plan's (``split_axis``, from gpt.arch; numpy stores W transposed).
"""
import numpy as np

from tp_from_scratch.gpt.arch import shard_axis
from tp_from_scratch.layers import reference as ref
from tp_from_scratch.sharding import check_divisible

REPLICATED_KEYS = ("ln1.weight", "ln1.bias", "attn.o.bias", "ln2.weight", "ln2.bias", "mlp.proj.bias")


def init_stack_params(rng, config, n_blocks, dtype=np.float64):
    """Random full params for n_blocks blocks of ``config`` (a layers.BlockConfig): a list of dicts."""
    return [ref.init_block_params(rng, config, dtype) for _ in range(n_blocks)]


def check_whole_kv_heads(config, t):
    """ValueError naming the size unless t ranks each hold their own query heads, KV heads and
    ffn columns: a CAAT stream never shares a KV head with another (no replicated KV heads)."""
    check_divisible(config.n_heads, t, "number of heads")
    check_divisible(config.n_kv_heads, t, "number of KV heads")
    check_divisible(config.ffn, t, "ffn size")


def split_axis(key):
    """The axis of block parameter ``key`` (numpy: W stored (in, out)) that TP splits, or None
    when it is Replicated: the GPT's plan's axis (torch stores (out, in)), transposed for weights."""
    axis = shard_axis(f"blocks.0.{key}", "gpt")
    return axis if axis is None or not key.endswith("weight") else 1 - axis
