"""Tensor-parallel causal self-attention: heads are split across ranks (Megatron), GQA included.

    x (B, T, H)  Replicated
      -> f -> q, k, v = x @ Wq_i, x @ Wk_i, x @ Wv_i   this rank's heads: column-parallel by heads
      -> causal attention over the local heads      (B, T, nh/t*hs)  Sharded(-1), no communication
      -> o_i @ Wo_i                                  (B, T, H)        Partial, Wo[nh*hs_t, H]
      -> g -> + b_o                                  (B, T, H)        Replicated: one all-reduce

Params are named as in the torch GPT's Attention, weights in the math layout (in, out):
q.weight (H, nh*hs), q.bias, k.weight (H, nkv*hs) (no key bias: see reference.attention_forward),
v.weight (H, nkv*hs), v.bias, o.weight (nh*hs, H), o.bias (H,). The single-device version is
reference.attention_forward(x, params, n_heads, n_kv_heads).

Heads never exchange data inside attention, so splitting by heads needs no communication
until the output projection. The three projections q, k, v share one f: their partial
input gradients are added on each rank before the single backward all-reduce.

Which heads live where (tp = t):
  * query heads: t must divide nh; rank r holds the contiguous heads r*nh/t .. (r+1)*nh/t - 1.
  * KV heads (query head j reads KV head j // (nh/nkv)):
      - t divides nkv: Sharded. Rank r holds KV heads r*nkv/t .. (r+1)*nkv/t - 1, exactly
        those its query heads read.
      - nkv < t and nkv divides t: Replicated in groups. Every rank holds (a copy of) the one
        KV head its query heads read; each KV head is copied to t/nkv neighbouring ranks.
        Each copy's gradient only covers that rank's query heads: it is Partial, and the true
        gradient is the sum over the t/nkv copies (gather_attention_grads sums them; a training
        step would all-reduce them within the group of ranks that share the head).
      - anything else (nkv > t but not divisible by t, or nkv < t not dividing t) raises a
        ValueError naming the number of KV heads: a rank would need KV heads that another rank
        also owns in part, and the neat split above no longer exists.
"""
import numpy as np

from tp_from_scratch.layers.linear import (
    check_rank, replicated_value, row_parallel_linear_backward, row_parallel_linear_forward)
from tp_from_scratch.layers.mappings import f_backward, f_forward
from tp_from_scratch.layers.reference import causal_attention_forward, qkv_attention_backward, qkv_attention_forward
from tp_from_scratch.sharding import check_divisible


def kv_heads_of_rank(n_heads, n_kv_heads, tp, rank):
    """(first KV head, number of KV heads) that rank ``rank`` holds; ValueError if they do not split.

    See the module docstring for the rule: Sharded when tp divides nkv, Replicated (one KV head
    per rank) when nkv divides tp.
    """
    check_divisible(n_heads, tp, "number of heads")
    check_rank(rank, tp)
    if n_heads % n_kv_heads != 0:
        raise ValueError(f"number of heads {n_heads} is not divisible by number of KV heads {n_kv_heads}")
    if n_kv_heads % tp == 0:  # Sharded
        per_rank = n_kv_heads // tp
        return rank * per_rank, per_rank
    if tp % n_kv_heads == 0:  # Replicated: ranks r*nkv//tp share a KV head
        return rank * n_kv_heads // tp, 1
    if n_kv_heads > tp:
        raise ValueError(f"number of KV heads {n_kv_heads} is not divisible by tp={tp}")
    raise ValueError(f"number of KV heads {n_kv_heads} does not divide tp={tp} (with fewer KV heads "
                     "than ranks, each KV head is copied to tp / n_kv_heads ranks)")


def _local_slices(n_heads, n_kv_heads, head_size, tp, rank):
    """Column slices of this rank's query heads in q.weight and KV heads in k.weight, v.weight."""
    q_per_rank = n_heads // tp
    first_kv, n_kv = kv_heads_of_rank(n_heads, n_kv_heads, tp, rank)
    q = slice(rank * q_per_rank * head_size, (rank + 1) * q_per_rank * head_size)
    kv = slice(first_kv * head_size, (first_kv + n_kv) * head_size)
    return q, kv


def parallel_attention_forward(comm, x, params_local, n_heads, n_kv_heads):
    """Causal self-attention over this rank's heads, then a row-parallel output projection.

    x (B, T, H) Replicated; params_local from shard_attention_params; n_heads, n_kv_heads are
    the GLOBAL counts. One all-reduce forward (g). Returns (y (B, T, H) Replicated, cache).
    """
    tp = comm.world_size
    _, n_kv_local = kv_heads_of_rank(n_heads, n_kv_heads, tp, comm.rank)
    o_local, c_attn = qkv_attention_forward(  # (B, T, nh/t*hs), Sharded(-1)
        f_forward(comm, x), params_local, n_heads // tp, n_kv_local)
    y, c_out = row_parallel_linear_forward(comm, o_local, params_local["o.weight"], params_local["o.bias"])
    return y, (c_attn, c_out)


def parallel_attention_backward(comm, dy, cache):
    """Backward of parallel_attention_forward for dy (B, T, H) Replicated; one all-reduce (f backward).

    Returns (dx (B, T, H) Replicated, grads_local) with the keys of the local params. For a
    Replicated KV head, this rank's gradient is its own query heads' contribution (Partial).
    """
    c_attn, c_out = cache
    do_local, dwo, dbo = row_parallel_linear_backward(comm, dy, c_out)  # (B, T, nh/t*hs)
    dx_partial, grads = qkv_attention_backward(do_local, c_attn)        # (B, T, H), Partial
    grads.update({"o.weight": dwo, "o.bias": dbo})
    return f_backward(comm, dx_partial), grads


def causal_attention(q, k, v):
    """softmax(q k^T / sqrt(hs) + causal mask) v for every head, GQA included (Exercise 4's first step).

    q (B, nh, T, hs); k, v (B, nkv, T, hs). Returns a new (B, nh, T, hs) array. Each rank runs
    it on its own heads only: heads never exchange data, so it needs no communication.
    """
    return causal_attention_forward(q, k, v)[0]


def shard_attention_params(params, n_heads, n_kv_heads, tp, rank):
    """Rank ``rank``'s local attention params from the full ones (layout in the module docstring).

    Raises a ValueError naming the quantity when heads do not split evenly over tp ranks.
    """
    head_size = params["q.weight"].shape[1] // n_heads
    q, kv = _local_slices(n_heads, n_kv_heads, head_size, tp, rank)
    local = {"q.weight": params["q.weight"][:, q], "q.bias": params["q.bias"][q],
             "k.weight": params["k.weight"][:, kv],
             "v.weight": params["v.weight"][:, kv], "v.bias": params["v.bias"][kv],
             "o.weight": params["o.weight"][q, :], "o.bias": params["o.bias"]}
    return {k: v.copy() for k, v in local.items()}


def _gather(params_local, n_heads, n_kv_heads, combine_copies):
    tp = len(params_local)
    def every(key):
        return [p[key] for p in params_local]

    full = {
        "q.weight": np.concatenate(every("q.weight"), axis=1),       # (H, nh*hs)
        "q.bias": np.concatenate(every("q.bias")),                   # (nh*hs,)
        "o.weight": np.concatenate(every("o.weight"), axis=0),       # (nh*hs, H)
        "o.bias": replicated_value(every("o.bias"), "o.bias"),       # (H,)
    }
    # the ranks holding each KV block, in rank order: one rank each when Sharded
    holders = {}
    for rank in range(tp):
        holders.setdefault(kv_heads_of_rank(n_heads, n_kv_heads, tp, rank)[0], []).append(rank)
    for key, axis in (("k.weight", 1), ("v.weight", 1), ("v.bias", 0)):
        blocks = [combine_copies([params_local[r][key] for r in ranks], f"{key} of ranks {ranks}")
                  for _, ranks in sorted(holders.items())]
        full[key] = np.concatenate(blocks, axis=axis)
    return full


def gather_attention_params(params_local, n_heads, n_kv_heads):
    """The full attention params from every rank's local params (inverse of shard_attention_params).

    Copies of a Replicated KV head (and o.bias) must be equal, and are checked to be.
    """
    return _gather(params_local, n_heads, n_kv_heads, replicated_value)


def gather_attention_grads(grads_local, n_heads, n_kv_heads):
    """The full attention gradients from every rank's local ones.

    Like gather_attention_params, except that the copies of a Replicated KV head hold Partial
    gradients: they are SUMMED over the ranks that share the head.
    """
    def add(copies, name):
        total = copies[0].copy()
        for c in copies[1:]:
            total += c
        return total

    return _gather(grads_local, n_heads, n_kv_heads, add)
