"""Exercise 4: causal self-attention split by heads, with grouped-query attention
(lessons/04_parallel_attention.ipynb).

Replace each `raise NotImplementedError(...)` with your code, then run
    make grade            (or: .venv/bin/python -m pytest exercises -m ex04 -x)

Shapes: x (B, T, H); nh query heads and nkv key/value heads of size hs; t = TP degree.
Full (single-device) parameters, named as in the torch GPT, weights in the math convention
y = x @ w + b (torch stores the transpose):
    q.weight (H, nh*hs), q.bias (nh*hs,)
    k.weight (H, nkv*hs)                    (no key bias: softmax would ignore it)
    v.weight (H, nkv*hs), v.bias (nkv*hs,)
    o.weight (nh*hs, H), o.bias (H,)
The columns of q.weight (and rows of o.weight) are grouped by head: head j owns columns
j*hs:(j+1)*hs. Query head j attends with key/value head j // (nh // nkv).

Start with causal_attention: the scores, the causal mask and the softmax, for any number
of heads. Then the parallel layer: you may use exercise 3's pieces from the library, e.g.
    from tp_from_scratch.layers.linear import row_parallel_linear_forward, ...
and the single-device helpers of tp_from_scratch.layers.reference: qkv_attention_forward(x,
params, n_heads, n_kv_heads) / qkv_attention_backward(do, cache) run the q, k, v projections
and causal attention for ANY number of heads (e.g. this rank's), without the output projection
(split_heads / merge_heads and linear_forward are there too, if you want your forward to call
your causal_attention and write the backward yourself).
The graders count your all-reduces: one forward and one backward, like the MLP (at t = 1 you
may skip them, as Megatron-LM does; collectives are counted only for t > 1). Never modify
an array you are given; return new arrays (shard_attention_params returns copies).
"""
import numpy as np  # noqa: F401

from tp_from_scratch.collectives import all_reduce  # noqa: F401


def causal_attention(q, k, v):
    """softmax(q k^T / sqrt(hs) + causal mask) v for every query head, with grouped-query attention.

    q (B, nh, T, hs); k, v (B, nkv, T, hs), nkv divides nh; query head j reads KV head
    j // (nh // nkv). Position i attends to positions 0..i only. Return a new (B, nh, T, hs)
    array. The graders use scores in the thousands: exp must never overflow.
    """
    raise NotImplementedError("Exercise 4 (causal_attention): see lessons/04_parallel_attention.ipynb")


def shard_attention_params(params, n_heads, n_kv_heads, tp, rank):
    """Rank `rank`'s share of the full attention parameters, for TP degree `tp`.

    Query heads are split into tp contiguous groups of nh/tp heads: rank r gets the columns
    of q.weight, q.bias (and the rows of o.weight) of its heads. o.bias is replicated.
    Key/value heads: if tp divides nkv, rank r gets nkv/tp contiguous KV heads; if nkv < tp,
    every rank gets (a copy of) the one KV head its query heads attend with.
    Raise a ValueError naming the quantity when the heads do not split that way: tp must
    divide nh, and either tp divides nkv or nkv divides tp, e.g.
    "number of heads 6 is not divisible by tp=4", "number of KV heads 3 is not divisible by tp=2",
    "number of KV heads 2 does not divide tp=3". The arrays returned are copies.
    """
    raise NotImplementedError("Exercise 4 (shard_attention_params): see lessons/04_parallel_attention.ipynb")


def parallel_attention_forward(comm, x, params_local, n_heads, n_kv_heads):
    """Causal self-attention over this rank's heads, then a row-parallel output projection.

    x: (B, T, H) replicated; params_local from shard_attention_params; n_heads, n_kv_heads:
    the GLOBAL head counts. Return (y, cache) with y (B, T, H), the full output on every rank.
    Collectives: one all-reduce forward (after the output projection), one backward.
    """
    raise NotImplementedError("Exercise 4 (parallel_attention_forward): see lessons/04_parallel_attention.ipynb")


def parallel_attention_backward(comm, dy, cache):
    """Given dL/dy (B, T, H), return (dx, grads_local).

    dx: (B, T, H), the full input gradient on every rank. grads_local: the keys of
    params_local, the gradients of this rank's shards. For a KV head that several ranks
    hold a copy of, return this rank's contribution (the gradient through its own query
    heads); the copies' gradients add up to the full gradient.
    """
    raise NotImplementedError("Exercise 4 (parallel_attention_backward): see lessons/04_parallel_attention.ipynb")
