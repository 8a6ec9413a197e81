"""The single-device reference layers are right: backward by finite differences, forward by torch.

Everything parallel is compared with these references, so they get two independent checks:
  * every hand-written backward agrees with central finite differences of its own forward
    (float64, a handful of random coordinates of every input and parameter);
  * every forward (and, as a second opinion, every gradient) agrees with PyTorch's own
    layers and autograd: F.gelu(approximate="tanh"), F.layer_norm, scaled_dot_product_attention.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.layers import BlockConfig, reference as ref
from tp_from_scratch.testing import random_array, rank_rng

# Central differences: the truncation error is O(eps^2) and the roundoff O(1e-16 / eps), so
# eps = 1e-6 leaves errors near 1e-9 relative to the gradient scale. A wrong backward is off
# by O(1). This is not a summation-order tolerance, hence the explicit override.
EPS = 1e-6
FD_TOL = 1e-7
COORDS = 6  # random coordinates checked per tensor


def check_gradients(forward, inputs, grads, dy, rng):
    """Compare grads[name] with central differences of L = sum(forward(inputs) * dy).

    forward: a function of the dict ``inputs`` (it must not modify them).
    """
    def loss():
        return float(np.sum(forward(inputs) * dy))

    for name, value in inputs.items():
        flat = value.reshape(-1)  # a view: nudging flat nudges inputs[name]
        coords = rng.choice(flat.size, size=min(COORDS, flat.size), replace=False)
        numeric = np.empty(len(coords))
        for i, c in enumerate(coords):
            saved = flat[c]
            flat[c] = saved + EPS
            up = loss()
            flat[c] = saved - EPS
            down = loss()
            flat[c] = saved
            numeric[i] = (up - down) / (2 * EPS)
        assert_matches_reference(grads[name].reshape(-1)[coords], numeric,
                                 name=f"finite-difference grad of {name}", tol=FD_TOL)


def test_linear_backward_matches_finite_differences():
    rng = rank_rng(0)
    inputs = {"x": random_array(rng, (2, 3, 5)), "w": random_array(rng, (5, 4)),
              "b": random_array(rng, (4,))}
    y, cache = ref.linear_forward(inputs["x"], inputs["w"], inputs["b"])
    dy = random_array(rng, y.shape)
    dx, dw, db = ref.linear_backward(dy, cache)
    check_gradients(lambda p: ref.linear_forward(p["x"], p["w"], p["b"])[0], inputs,
                    {"x": dx, "w": dw, "b": db}, dy, rng)


def test_gelu_backward_matches_finite_differences():
    rng = rank_rng(1)
    inputs = {"x": 2 * random_array(rng, (3, 7))}
    y, cache = ref.gelu_forward(inputs["x"])
    dy = random_array(rng, y.shape)
    check_gradients(lambda p: ref.gelu_forward(p["x"])[0], inputs,
                    {"x": ref.gelu_backward(dy, cache)}, dy, rng)


def test_layernorm_backward_matches_finite_differences():
    rng = rank_rng(2)
    inputs = {"x": random_array(rng, (2, 3, 6)), "g": random_array(rng, (6,)),
              "b": random_array(rng, (6,))}
    y, cache = ref.layernorm_forward(inputs["x"], inputs["g"], inputs["b"])
    dy = random_array(rng, y.shape)
    dx, dg, db = ref.layernorm_backward(dy, cache)
    check_gradients(lambda p: ref.layernorm_forward(p["x"], p["g"], p["b"])[0], inputs,
                    {"x": dx, "g": dg, "b": db}, dy, rng)


def test_mlp_backward_matches_finite_differences():
    rng = rank_rng(3)
    params = ref.init_mlp_params(rng, hidden=4, ffn=8)
    inputs = {"x": random_array(rng, (2, 3, 4)), **params}
    y, cache = ref.mlp_forward(inputs["x"], params)
    dy = random_array(rng, y.shape)
    dx, grads = ref.mlp_backward(dy, cache)
    check_gradients(lambda p: ref.mlp_forward(p["x"], p)[0], inputs, {"x": dx, **grads}, dy, rng)


@pytest.mark.parametrize("n_heads,n_kv_heads", [(4, 4), (4, 2), (4, 1)])
def test_attention_backward_matches_finite_differences(n_heads, n_kv_heads):
    rng = rank_rng(4, n_kv_heads)
    params = ref.init_attention_params(rng, 8, n_heads, n_kv_heads)
    inputs = {"x": random_array(rng, (2, 5, 8)), **params}
    y, cache = ref.attention_forward(inputs["x"], params, n_heads, n_kv_heads)
    dy = random_array(rng, y.shape)
    dx, grads = ref.attention_backward(dy, cache)
    check_gradients(lambda p: ref.attention_forward(p["x"], p, n_heads, n_kv_heads)[0],
                    inputs, {"x": dx, **grads}, dy, rng)


def test_block_backward_matches_finite_differences():
    rng = rank_rng(5)
    config = BlockConfig(hidden=8, n_heads=4, n_kv_heads=2, ffn=12)
    params = ref.init_block_params(rng, config)
    inputs = {"x": random_array(rng, (2, 4, 8)), **params}
    y, cache = ref.block_forward(inputs["x"], params, config)
    dy = random_array(rng, y.shape)
    dx, grads = ref.block_backward(dy, cache)
    assert set(grads) == set(params)
    check_gradients(lambda p: ref.block_forward(p["x"], p, config)[0], inputs,
                    {"x": dx, **grads}, dy, rng)


# ----------------------------------------------------------------------------------------
# Forward (and gradients) against PyTorch, an independent implementation of the same math
# ----------------------------------------------------------------------------------------


def torch_block(x, p, config):
    """The same pre-LN GQA block written with torch's own functions (y = x @ W convention)."""
    nh, nkv, H = config.n_heads, config.n_kv_heads, config.hidden
    B, T, _ = x.shape

    def heads(y, n):  # (B, T, n*hs) -> (B, n, T, hs)
        return y.view(B, T, n, -1).transpose(1, 2)

    a = F.layer_norm(x, (H,), p["ln1_g"], p["ln1_b"], eps=1e-5)
    q = heads(a @ p["attn.wq"] + p["attn.bq"], nh)
    k = heads(a @ p["attn.wk"] + p["attn.bk"], nkv).repeat_interleave(nh // nkv, dim=1)
    v = heads(a @ p["attn.wv"] + p["attn.bv"], nkv).repeat_interleave(nh // nkv, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
    h = x + o.transpose(1, 2).reshape(B, T, -1) @ p["attn.wo"] + p["attn.bo"]
    m = F.layer_norm(h, (H,), p["ln2_g"], p["ln2_b"], eps=1e-5)
    mlp = F.gelu(m @ p["mlp.w1"] + p["mlp.b1"], approximate="tanh") @ p["mlp.w2"] + p["mlp.b2"]
    return h + mlp


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_block_matches_torch(n_kv_heads, dtype):
    rng = rank_rng(6, n_kv_heads)
    config = BlockConfig(hidden=16, n_heads=4, n_kv_heads=n_kv_heads, ffn=24)
    params = ref.init_block_params(rng, config, dtype)
    x = random_array(rng, (2, 5, 16), dtype)
    dy = random_array(rng, (2, 5, 16), dtype)

    y, cache = ref.block_forward(x, params, config)
    dx, grads = ref.block_backward(dy, cache)

    tx = torch.tensor(x, requires_grad=True)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    ty = torch_block(tx, tp, config)
    ty.backward(torch.tensor(dy))

    # torch fuses and orders its sums differently: the summation-order tolerance applies
    assert_matches_reference(y, ty, name="block output")
    assert_matches_reference(dx, tx.grad, name="grad of x")
    for k in params:
        assert_matches_reference(grads[k], tp[k].grad, name=f"grad of {k}")


def test_float32_stays_float32():
    rng = rank_rng(7)
    config = BlockConfig(hidden=8, n_heads=2, n_kv_heads=1, ffn=16)
    params = ref.init_block_params(rng, config, np.float32)
    x = random_array(rng, (1, 3, 8), np.float32)
    y, cache = ref.block_forward(x, params, config)
    dx, grads = ref.block_backward(np.ones_like(y), cache)
    assert y.dtype == dx.dtype == np.float32
    assert all(g.dtype == np.float32 for g in grads.values())
