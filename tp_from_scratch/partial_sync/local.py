"""What one rank computes on its own stream between two partial reduces: no communication.

Both the TP block (block.py, one stream per rank) and the single-device reference
(reference.py, all t streams in one process) call these functions on a rank's local
parameters. Each returns the row-parallel layer's Partial output, x_i @ W_i, before any
reduction and before its bias.

Column layers here read their input as it is: in CAAT each rank's input is its own stream,
so there is no f (and no backward all-reduce) in front of them; dx is this stream's own.
"""
from tp_from_scratch.layers.reference import (
    causal_attention_backward, causal_attention_forward, gelu_backward, gelu_forward,
    linear_backward, linear_forward, merge_heads, split_heads)


def attention_partial_forward(x, local, n_heads, n_kv_heads):
    """This rank's heads on x (B, T, H), then o_i @ Wo_i: returns (partial (B, T, H), cache).

    n_heads, n_kv_heads: the LOCAL counts (nh/t, nkv/t). local: keys "attn.*" of params.py.
    """
    q, cq = linear_forward(x, local["attn.q.weight"], local["attn.q.bias"])  # (B, T, nh/t*hs)
    k, ck = linear_forward(x, local["attn.k.weight"], None)                  # (B, T, nkv/t*hs)
    v, cv = linear_forward(x, local["attn.v.weight"], local["attn.v.bias"])  # (B, T, nkv/t*hs)
    out, ca = causal_attention_forward(
        split_heads(q, n_heads), split_heads(k, n_kv_heads), split_heads(v, n_kv_heads))
    partial, co = linear_forward(merge_heads(out), local["attn.o.weight"], None)  # (B, T, H)
    return partial, (cq, ck, cv, ca, co)


def attention_partial_backward(dpartial, cache):
    """Backward of attention_partial_forward: (dx (B, T, H) of this stream, grads of the weights)."""
    cq, ck, cv, ca, co = cache
    dout, dwo, _ = linear_backward(dpartial, co)
    nh = ca[0].shape[1]
    dq, dk, dv = causal_attention_backward(split_heads(dout, nh), ca)
    dx_q, dwq, dbq = linear_backward(merge_heads(dq), cq)
    dx_k, dwk, _ = linear_backward(merge_heads(dk), ck)
    dx_v, dwv, dbv = linear_backward(merge_heads(dv), cv)
    grads = {"attn.q.weight": dwq, "attn.q.bias": dbq, "attn.k.weight": dwk,
             "attn.v.weight": dwv, "attn.v.bias": dbv, "attn.o.weight": dwo}
    return dx_q + dx_k + dx_v, grads


def mlp_partial_forward(x, local):
    """gelu(x @ W1_i + b1_i) @ W2_i for x (B, T, H): returns (partial (B, T, H), cache)."""
    a, c1 = linear_forward(x, local["mlp.fc.weight"], local["mlp.fc.bias"])  # (B, T, F/t)
    h, cg = gelu_forward(a)
    partial, c2 = linear_forward(h, local["mlp.proj.weight"], None)          # (B, T, H)
    return partial, (c1, cg, c2)


def mlp_partial_backward(dpartial, cache):
    """Backward of mlp_partial_forward: (dx (B, T, H) of this stream, grads of the weights)."""
    c1, cg, c2 = cache
    dh, dw2, _ = linear_backward(dpartial, c2)
    dx, dw1, db1 = linear_backward(gelu_backward(dh, cg), c1)
    return dx, {"mlp.fc.weight": dw1, "mlp.fc.bias": db1, "mlp.proj.weight": dw2}
