"""Known-wrong: shard_attention_params only rejects nkv > t that t does not divide; nkv=2 with t=3
(2 does not divide 3) slips through and hands out KV heads that do not match the query heads."""
from tp_from_scratch.layers.attention import causal_attention, parallel_attention_backward  # noqa: F401
from tp_from_scratch.layers.attention import parallel_attention_forward  # noqa: F401


def shard_attention_params(params, n_heads, n_kv_heads, tp, rank):
    if n_heads % tp:
        raise ValueError(f"number of heads {n_heads} is not divisible by tp={tp}")
    if n_kv_heads >= tp and n_kv_heads % tp:
        raise ValueError(f"number of KV heads {n_kv_heads} is not divisible by tp={tp}")
    hs = params["q.weight"].shape[1] // n_heads
    q = slice(rank * (n_heads // tp) * hs, (rank + 1) * (n_heads // tp) * hs)
    if n_kv_heads >= tp:
        per = n_kv_heads // tp
        kv = slice(rank * per * hs, (rank + 1) * per * hs)
    else:
        head = rank * n_kv_heads // tp  # wrong when n_kv_heads does not divide tp
        kv = slice(head * hs, (head + 1) * hs)
    return {"q.weight": params["q.weight"][:, q].copy(), "q.bias": params["q.bias"][q].copy(),
            "k.weight": params["k.weight"][:, kv].copy(),
            "v.weight": params["v.weight"][:, kv].copy(), "v.bias": params["v.bias"][kv].copy(),
            "o.weight": params["o.weight"][q, :].copy(), "o.bias": params["o.bias"].copy()}
