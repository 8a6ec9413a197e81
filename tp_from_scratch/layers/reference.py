"""Single-device reference layers in numpy: forward AND hand-written backward, no communication.

Every tensor-parallel layer in this package is checked against these functions, and these
functions are themselves checked against finite differences (tests/test_layers_reference.py).

Conventions
  * Weights follow the math convention Y = X @ W + b, with W of shape (in, out). torch's
    nn.Linear stores the transpose, weight (out, in) = W^T, and computes x @ weight.T + bias.
  * Parameter names are those of the later lessons' torch GPT Block, so one dict
    of names fits both: ln1.weight, ln1.bias, attn.{q,k,v,o}.weight and .bias (no
    attn.k.bias, see attention_forward), ln2.weight, ln2.bias, mlp.{fc,proj}.weight and .bias.
    params_from_torch / params_to_torch convert a state_dict by transposing the 2-D weights.
  * Each ``*_forward`` returns ``(output, cache)``; the matching ``*_backward`` takes the
    gradient of the output and that cache, and returns the gradients of the inputs
    (and a dict of parameter gradients, keyed like the params).
  * Every function keeps the dtype of its inputs (float32 in, float32 out).

Shape legend: B batch, T sequence, H hidden, F ffn, nh query heads, nkv KV heads, hs head size.
"""
from dataclasses import dataclass

import numpy as np

# ---------------------------------------------------------------------------------------
# Linear: Y = X @ W + b
# ---------------------------------------------------------------------------------------


def linear_forward(x, w, b):
    """Y = X @ W + b for X (..., in), W (in, out), b (out,) or None; returns (Y (..., out), cache)."""
    y = x @ w
    if b is not None:
        y = y + b
    return y, (x, w, b is not None)


def linear_backward(dy, cache):
    """Gradients of Y = X @ W + b: dX = dY @ W^T, dW = X^T @ dY, db = sum of dY over all rows.

    Returns (dx, dw, db); db is None when the forward had no bias.
    """
    x, w, has_bias = cache
    dx = dy @ w.T  # (..., out) @ (out, in) -> (..., in)
    # flatten every leading axis (B, T, ...) into one axis of rows
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    dw = x2.T @ dy2  # (in, rows) @ (rows, out) -> (in, out)
    db = dy2.sum(axis=0) if has_bias else None
    return dx, dw, db


# ---------------------------------------------------------------------------------------
# GeLU, the tanh approximation (GPT-2's "gelu_new"):
#   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
# ---------------------------------------------------------------------------------------
_GELU_C = np.sqrt(2.0 / np.pi)
_GELU_A = 0.044715


def gelu_forward(x):
    """GeLU with the tanh approximation, element-wise; returns (y, cache).

    This is GPT-2's "gelu_new", torch's F.gelu(x, approximate="tanh"). torch's default is
    the exact erf form 0.5 x (1 + erf(x / sqrt 2)); the two
    differ by up to 4.7e-4 (near |x| = 2.7), so compare a numpy block with a torch block
    only when both use the same form.
    """
    c, a = x.dtype.type(_GELU_C), x.dtype.type(_GELU_A)  # keep float32 inputs in float32
    tanh_u = np.tanh(c * (x + a * x**3))
    return 0.5 * x * (1 + tanh_u), (x, tanh_u)


def gelu_backward(dy, cache):
    """d gelu / dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx, du/dx = sqrt(2/pi)(1 + 3a x^2)."""
    x, tanh_u = cache
    c, a = x.dtype.type(_GELU_C), x.dtype.type(_GELU_A)
    du = c * (1 + 3 * a * x**2)
    return dy * (0.5 * (1 + tanh_u) + 0.5 * x * (1 - tanh_u**2) * du)


# ---------------------------------------------------------------------------------------
# LayerNorm over the last axis: y = (x - mean) / sqrt(var + eps) * g + b
# ---------------------------------------------------------------------------------------


def layernorm_forward(x, g, b, eps=1e-5):
    """LayerNorm over the last axis (H) with gain g (H,) and bias b (H,); returns (y, cache)."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt(var + x.dtype.type(eps))
    xhat = (x - mean) * rstd
    return xhat * g + b, (xhat, rstd, g)


def layernorm_backward(dy, cache):
    """Gradients of LayerNorm: returns (dx, dg, db).

    With xhat the normalised input and dxhat = dy * g:
    dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), means over the last axis.
    """
    xhat, rstd, g = cache
    rows = xhat.shape[-1]
    dg = (dy * xhat).reshape(-1, rows).sum(axis=0)
    db = dy.reshape(-1, rows).sum(axis=0)
    dxhat = dy * g
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, dg, db


# ---------------------------------------------------------------------------------------
# MLP: Linear(H -> F), GeLU, Linear(F -> H)
# ---------------------------------------------------------------------------------------


def mlp_forward(x, params):
    """y = gelu(x @ W_fc + b_fc) @ W_proj + b_proj for x (B, T, H); returns (y, cache).

    params: fc.weight (H, F), fc.bias (F,), proj.weight (F, H), proj.bias (H,).
    """
    a, c1 = linear_forward(x, params["fc.weight"], params["fc.bias"])      # (B, T, F)
    h, cg = gelu_forward(a)                                                 # (B, T, F)
    y, c2 = linear_forward(h, params["proj.weight"], params["proj.bias"])  # (B, T, H)
    return y, (c1, cg, c2)


def mlp_backward(dy, cache):
    """Backward of mlp_forward: returns (dx, grads) with the keys of the params."""
    c1, cg, c2 = cache
    dh, dw_proj, db_proj = linear_backward(dy, c2)
    da = gelu_backward(dh, cg)
    dx, dw_fc, db_fc = linear_backward(da, c1)
    return dx, {"fc.weight": dw_fc, "fc.bias": db_fc, "proj.weight": dw_proj, "proj.bias": db_proj}


# ---------------------------------------------------------------------------------------
# Causal self-attention with grouped-query attention (GQA)
#   query head j reads KV head j // (nh / nkv); nkv = nh is ordinary multi-head attention.
# ---------------------------------------------------------------------------------------


def split_heads(y, n):
    """(B, T, n*hs) -> (B, n, T, hs)."""
    B, T, D = y.shape
    return y.reshape(B, T, n, D // n).transpose(0, 2, 1, 3)


def merge_heads(y):
    """(B, n, T, hs) -> (B, T, n*hs): the inverse of split_heads."""
    B, n, T, hs = y.shape
    return y.transpose(0, 2, 1, 3).reshape(B, T, n * hs)


def causal_attention_forward(q, k, v):
    """softmax(q k^T / sqrt(hs) + causal mask) v, head by head, with GQA.

    q (B, nh, T, hs); k, v (B, nkv, T, hs) with nkv dividing nh. Returns (out (B, nh, T, hs), cache).
    The parallel attention calls this unchanged on its local heads: heads never talk to each other.
    """
    nh, nkv, T, hs = q.shape[1], k.shape[1], q.shape[2], q.shape[3]
    if nh % nkv != 0:
        raise ValueError(f"number of heads {nh} is not divisible by number of KV heads {nkv}")
    group = nh // nkv
    k_rep = np.repeat(k, group, axis=1)  # (B, nh, T, hs): query head j sees KV head j // group
    v_rep = np.repeat(v, group, axis=1)
    scale = q.dtype.type(1 / np.sqrt(hs))
    scores = (q @ k_rep.transpose(0, 1, 3, 2)) * scale  # (B, nh, T, T)
    future = np.triu(np.ones((T, T), dtype=bool), k=1)  # position i may not look at j > i
    scores = np.where(future, -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)  # stable softmax: exp never overflows
    e = np.exp(scores)
    att = e / e.sum(axis=-1, keepdims=True)  # (B, nh, T, T)
    out = att @ v_rep  # (B, nh, T, hs)
    return out, (q, k_rep, v_rep, att, group, scale)


def causal_attention_backward(dout, cache):
    """Backward of causal_attention_forward: returns (dq, dk, dv).

    A KV head shared by ``group`` query heads receives the SUM of their gradients.
    """
    q, k_rep, v_rep, att, group, scale = cache
    datt = dout @ v_rep.transpose(0, 1, 3, 2)  # (B, nh, T, T)
    dv_rep = att.transpose(0, 1, 3, 2) @ dout  # (B, nh, T, hs)
    # softmax backward; masked entries have att = 0 and so get no gradient
    dscores = att * (datt - (datt * att).sum(axis=-1, keepdims=True)) * scale
    dq = dscores @ k_rep                           # (B, nh, T, hs)
    dk_rep = dscores.transpose(0, 1, 3, 2) @ q     # (B, nh, T, hs)
    B, nh, T, hs = q.shape

    def fold(d):  # (B, nh, T, hs) -> (B, nkv, T, hs): sum over the query heads of each group
        return d.reshape(B, nh // group, group, T, hs).sum(axis=2)

    return dq, fold(dk_rep), fold(dv_rep)


def qkv_attention_forward(x, params, n_heads, n_kv_heads):
    """Project x to q, k, v, attend causally, merge heads; no output projection.

    x (B, T, H), params q.weight (H, nh*hs), q.bias, k.weight (H, nkv*hs) (no bias: see
    attention_forward), v.weight (H, nkv*hs), v.bias. Returns (o (B, T, nh*hs), cache).
    Shared by the reference and the parallel attention (which passes its local heads).
    """
    q, cq = linear_forward(x, params["q.weight"], params["q.bias"])  # (B, T, nh*hs)
    k, ck = linear_forward(x, params["k.weight"], None)              # (B, T, nkv*hs)
    v, cv = linear_forward(x, params["v.weight"], params["v.bias"])  # (B, T, nkv*hs)
    out, ca = causal_attention_forward(
        split_heads(q, n_heads), split_heads(k, n_kv_heads), split_heads(v, n_kv_heads))
    return merge_heads(out), (cq, ck, cv, ca)


def qkv_attention_backward(do, cache):
    """Backward of qkv_attention_forward: returns (dx, grads) with the keys of its params."""
    cq, ck, cv, ca = cache
    nh = ca[0].shape[1]
    dq, dk, dv = causal_attention_backward(split_heads(do, nh), ca)
    dx_q, dwq, dbq = linear_backward(merge_heads(dq), cq)
    dx_k, dwk, _ = linear_backward(merge_heads(dk), ck)
    dx_v, dwv, dbv = linear_backward(merge_heads(dv), cv)
    grads = {"q.weight": dwq, "q.bias": dbq, "k.weight": dwk, "v.weight": dwv, "v.bias": dbv}
    return dx_q + dx_k + dx_v, grads


def attention_forward(x, params, n_heads, n_kv_heads):
    """Causal multi-head (GQA) self-attention: y = attend(x W_q + b_q, x W_k, x W_v + b_v) W_o + b_o.

    x (B, T, H); params q.weight (H, nh*hs), q.bias (nh*hs,), k.weight, v.weight (H, nkv*hs),
    v.bias (nkv*hs,), o.weight (nh*hs, H), o.bias (H,). Returns (y (B, T, H), cache).
    No key bias, as in the torch GPT: it would add q_i . b_k to every score of query i, the
    same value along the whole row that softmax normalises, so it never changes the output
    and its gradient is exactly zero (tests/test_layers_reference.py checks both).
    """
    o, c_attn = qkv_attention_forward(x, params, n_heads, n_kv_heads)       # (B, T, nh*hs)
    y, c_out = linear_forward(o, params["o.weight"], params["o.bias"])      # (B, T, H)
    return y, (c_attn, c_out)


def attention_backward(dy, cache):
    """Backward of attention_forward: returns (dx, grads) with the same keys as the params."""
    c_attn, c_out = cache
    do, dwo, dbo = linear_backward(dy, c_out)
    dx, grads = qkv_attention_backward(do, c_attn)
    grads.update({"o.weight": dwo, "o.bias": dbo})
    return dx, grads


# ---------------------------------------------------------------------------------------
# Pre-LayerNorm transformer block: h = x + attn(ln1(x)); y = h + mlp(ln2(h))
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockConfig:
    """Sizes of a transformer block: hidden H, query heads nh, KV heads nkv, ffn F (often 4H)."""
    hidden: int
    n_heads: int
    n_kv_heads: int
    ffn: int

    def __post_init__(self):
        for name in ("hidden", "n_heads", "n_kv_heads", "ffn"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.hidden % self.n_heads != 0:
            raise ValueError(f"hidden size {self.hidden} is not divisible by number of heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(f"number of heads {self.n_heads} is not divisible by "
                             f"number of KV heads {self.n_kv_heads}")

    @property
    def head_size(self):
        """hs = H / nh."""
        return self.hidden // self.n_heads


def sub_params(params, prefix):
    """The entries of ``params`` whose key starts with ``prefix``, with the prefix removed."""
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def block_forward(x, params, config):
    """Pre-LN block on x (B, T, H): h = x + attn(ln1(x)); y = h + mlp(ln2(h)). Returns (y, cache).

    params: ln1.weight, ln1.bias, ln2.weight, ln2.bias (H,), attention params prefixed "attn.",
    MLP params prefixed "mlp." (the torch GPT Block's names); config: anything with n_heads
    and n_kv_heads (e.g. layers.BlockConfig).
    """
    a, c_ln1 = layernorm_forward(x, params["ln1.weight"], params["ln1.bias"])
    att, c_att = attention_forward(a, sub_params(params, "attn."), config.n_heads, config.n_kv_heads)
    h = x + att
    m, c_ln2 = layernorm_forward(h, params["ln2.weight"], params["ln2.bias"])
    mlp, c_mlp = mlp_forward(m, sub_params(params, "mlp."))
    return h + mlp, (c_ln1, c_att, c_ln2, c_mlp)


def block_backward(dy, cache):
    """Backward of block_forward: returns (dx, grads) with the same keys as the params."""
    c_ln1, c_att, c_ln2, c_mlp = cache
    dm, g_mlp = mlp_backward(dy, c_mlp)
    dh_ln, dg2, db2 = layernorm_backward(dm, c_ln2)
    dh = dy + dh_ln  # the residual passes dy straight through
    da, g_att = attention_backward(dh, c_att)
    dx_ln, dg1, db1 = layernorm_backward(da, c_ln1)
    grads = {"ln1.weight": dg1, "ln1.bias": db1, "ln2.weight": dg2, "ln2.bias": db2}
    grads.update({f"attn.{k}": v for k, v in g_att.items()})
    grads.update({f"mlp.{k}": v for k, v in g_mlp.items()})
    return dh + dx_ln, grads


# ---------------------------------------------------------------------------------------
# Random full (single-device) parameters, for tests, lessons and demos
# ---------------------------------------------------------------------------------------


def init_mlp_params(rng, hidden, ffn, dtype=np.float64):
    """Random MLP params (see mlp_forward), weights scaled like 1/sqrt(fan_in)."""
    return {
        "fc.weight": (rng.standard_normal((hidden, ffn)) / np.sqrt(hidden)).astype(dtype),
        "fc.bias": (0.1 * rng.standard_normal(ffn)).astype(dtype),
        "proj.weight": (rng.standard_normal((ffn, hidden)) / np.sqrt(ffn)).astype(dtype),
        "proj.bias": (0.1 * rng.standard_normal(hidden)).astype(dtype),
    }


def init_attention_params(rng, hidden, n_heads, n_kv_heads, head_size=None, dtype=np.float64):
    """Random attention params (see attention_forward); head_size defaults to hidden / n_heads."""
    hs = head_size or hidden // n_heads
    shapes = {"q": (hidden, n_heads * hs), "k": (hidden, n_kv_heads * hs),
              "v": (hidden, n_kv_heads * hs), "o": (n_heads * hs, hidden)}
    params = {}
    for name, (n_in, n_out) in shapes.items():
        params[f"{name}.weight"] = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(dtype)
        if name != "k":  # no key bias (see attention_forward)
            params[f"{name}.bias"] = (0.1 * rng.standard_normal(n_out)).astype(dtype)
    return params


def init_block_params(rng, config, dtype=np.float64):
    """Random block params for a config with hidden, n_heads, n_kv_heads, ffn (see block_forward)."""
    H = config.hidden
    params = {
        "ln1.weight": (1 + 0.1 * rng.standard_normal(H)).astype(dtype),
        "ln1.bias": (0.1 * rng.standard_normal(H)).astype(dtype),
        "ln2.weight": (1 + 0.1 * rng.standard_normal(H)).astype(dtype),
        "ln2.bias": (0.1 * rng.standard_normal(H)).astype(dtype),
    }
    attn = init_attention_params(rng, H, config.n_heads, config.n_kv_heads, dtype=dtype)
    params.update({f"attn.{k}": v for k, v in attn.items()})
    params.update({f"mlp.{k}": v for k, v in init_mlp_params(rng, H, config.ffn, dtype).items()})
    return params


# ---------------------------------------------------------------------------------------
# The same parameters as a torch state_dict: same names, 2-D weights transposed
# ---------------------------------------------------------------------------------------


def params_from_torch(state_dict):
    """numpy params (W (in, out)) from a torch state_dict (weight (out, in) = W^T), same names.

    Meant for the layers of this package (the torch GPT Block's state_dict gives the params of
    block_forward), where every 2-D tensor is a linear weight: it comes back transposed, and
    1-D ones (biases, LayerNorm weights) as they are. An embedding table (V, H) is not a
    linear weight and would be transposed wrongly. Fresh C-contiguous arrays: nothing aliases.
    """
    params = {}
    for name, value in state_dict.items():
        a = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
        params[name] = np.array(a.T if a.ndim == 2 else a, order="C")  # np.array copies
    return params


def params_to_torch(params):
    """A torch state_dict (weight (out, in)) from numpy params (W (in, out)): the inverse of params_from_torch.

    Load it with module.load_state_dict(...); the tensors are fresh copies on the CPU.
    """
    import torch  # only here: the numpy layers themselves never need torch

    return {name: torch.from_numpy(np.array(a.T if a.ndim == 2 else a, order="C"))
            for name, a in params.items()}
