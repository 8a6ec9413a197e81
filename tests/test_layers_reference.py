"""The single-device reference layers are right: backward by finite differences, forward by torch.

Everything parallel is compared with these references, so they get two independent checks:
  * every hand-written backward agrees with central finite differences of its own forward
    (float64, a handful of random coordinates of every input and parameter);
  * every forward (and, as a second opinion, every gradient) agrees with PyTorch's own
    layers and autograd: F.linear, F.gelu(approximate="tanh"), F.layer_norm,
    scaled_dot_product_attention, on the same parameters in torch's layout (params_to_torch).
It also checks the two facts the shared vocabulary rests on: the parameter names fit the torch
GPT's Block (a strict load_state_dict), and a key bias, which neither model has, could never
change the output nor get a gradient.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tp_from_scratch.compare import assert_all_match, assert_matches_reference, finite_difference_tolerance
from tp_from_scratch.layers import BlockConfig, reference as ref
from tp_from_scratch.testing import random_array, rank_rng

# Central differences: the truncation error is O(eps^2) and the roundoff O(1e-16 / eps), so
# eps = 1e-6 leaves errors near 1e-9 relative to the gradient scale. A wrong backward is off
# by O(1). This is not a summation-order tolerance: the policy's finite-difference bound.
EPS = 1e-6
FD_TOL = finite_difference_tolerance(EPS, "float64")
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
    """The same pre-LN GQA block written with torch's own functions, on a torch state_dict.

    p holds torch's layout, weight (out, in), and F.linear computes x @ weight.T + bias.
    """
    nh, nkv, H = config.n_heads, config.n_kv_heads, config.hidden
    B, T, _ = x.shape

    def heads(y, n):  # (B, T, n*hs) -> (B, n, T, hs)
        return y.view(B, T, n, -1).transpose(1, 2)

    a = F.layer_norm(x, (H,), p["ln1.weight"], p["ln1.bias"], eps=1e-5)
    q = heads(F.linear(a, p["attn.q.weight"], p["attn.q.bias"]), nh)
    k = heads(F.linear(a, p["attn.k.weight"]), nkv).repeat_interleave(nh // nkv, dim=1)
    v = heads(F.linear(a, p["attn.v.weight"], p["attn.v.bias"]), nkv).repeat_interleave(nh // nkv, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
    h = x + F.linear(o.transpose(1, 2).reshape(B, T, -1), p["attn.o.weight"], p["attn.o.bias"])
    m = F.layer_norm(h, (H,), p["ln2.weight"], p["ln2.bias"], eps=1e-5)
    fc = F.gelu(F.linear(m, p["mlp.fc.weight"], p["mlp.fc.bias"]), approximate="tanh")
    return h + F.linear(fc, p["mlp.proj.weight"], p["mlp.proj.bias"])


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
    tp = {k: v.requires_grad_() for k, v in ref.params_to_torch(params).items()}  # weights (out, in)
    ty = torch_block(tx, tp, config)
    ty.backward(torch.tensor(dy))
    torch_grads = ref.params_from_torch({k: v.grad for k, v in tp.items()})  # back to (in, out)

    # torch fuses and orders its sums differently: the summation-order tolerance applies
    assert_matches_reference(y, ty, name="block output")
    assert_matches_reference(dx, tx.grad, name="grad of x")
    assert set(grads) == set(torch_grads)
    for k in params:
        assert_matches_reference(grads[k], torch_grads[k], name=f"grad of {k}")


def test_float32_stays_float32():
    rng = rank_rng(7)
    config = BlockConfig(hidden=8, n_heads=2, n_kv_heads=1, ffn=16)
    params = ref.init_block_params(rng, config, np.float32)
    x = random_array(rng, (1, 3, 8), np.float32)
    y, cache = ref.block_forward(x, params, config)
    dx, grads = ref.block_backward(np.ones_like(y), cache)
    assert y.dtype == dx.dtype == np.float32
    assert all(g.dtype == np.float32 for g in grads.values())


# ----------------------------------------------------------------------------------------
# One vocabulary with the torch GPT: same names, same biases, weights transposed
# ----------------------------------------------------------------------------------------


def test_params_round_trip_through_a_torch_state_dict():
    rng = rank_rng(8)
    config = BlockConfig(hidden=8, n_heads=4, n_kv_heads=2, ffn=12)
    params = ref.init_block_params(rng, config, np.float32)
    state = ref.params_to_torch(params)
    assert set(state) == set(params)
    for name, value in params.items():
        # torch stores weight (out, in) = W^T; 1-D tensors keep their shape
        assert tuple(state[name].shape) == value.T.shape, name
        assert_matches_reference(state[name].numpy(), value.T, name=name, exact=True)
    back = ref.params_from_torch(state)
    for name, value in params.items():
        assert_matches_reference(back[name], value, name=f"{name} after the round trip", exact=True)
        assert not np.shares_memory(back[name], value), name  # fresh arrays, nothing aliased
    state["attn.q.weight"][0, 0] += 1  # and the torch side holds copies too
    assert_matches_reference(back["attn.q.weight"], params["attn.q.weight"], name="q.weight", exact=True)


def test_block_params_fit_the_torch_gpt_block_exactly():
    # the names, shapes and bias choices of the numpy block are those of gpt.model.Block:
    # a strict load fails on any missing, extra or mis-shaped entry
    from tp_from_scratch.gpt.model import GPT, GPTConfig

    config = BlockConfig(hidden=16, n_heads=4, n_kv_heads=2, ffn=24)
    torch_block_module = GPT(GPTConfig(vocab_size=11, seq_len=4, n_layers=1, hidden=16, n_heads=4,
                                       n_kv_heads=2, ffn=24)).blocks[0]
    params = ref.init_block_params(rank_rng(9), config, np.float32)
    torch_block_module.load_state_dict(ref.params_to_torch(params), strict=True)
    loaded = ref.params_from_torch(torch_block_module.state_dict())
    assert_all_match(loaded, params, exact=True)


def test_a_key_bias_changes_nothing_and_gets_no_gradient():
    # Why neither model has attn.k.bias: q_i . (k_j + b_k) = q_i . k_j + q_i . b_k adds the same
    # number to every score in row i, and softmax is unchanged by a constant added to its row.
    rng = rank_rng(10)
    nh, nkv, H = 4, 2, 8
    params = ref.init_attention_params(rng, H, nh, nkv)
    x, do = random_array(rng, (2, 5, H)), random_array(rng, (2, 5, H))
    bias = 3 * random_array(rng, (H // nh * nkv,))
    o_without, _ = ref.qkv_attention_forward(x, params, nh, nkv)

    def attend(q_bias, k_bias):  # the attention of qkv_attention_forward, with extra biases
        q = x @ params["q.weight"] + params["q.bias"] + q_bias
        k = x @ params["k.weight"] + k_bias
        v = x @ params["v.weight"] + params["v.bias"]
        out, cache = ref.causal_attention_forward(
            ref.split_heads(q, nh), ref.split_heads(k, nkv), ref.split_heads(v, nkv))
        return ref.merge_heads(out), cache

    o_with, cache = attend(0, bias)
    assert_matches_reference(o_with, o_without, name="attention output with a key bias")
    _, dk, dv = ref.causal_attention_backward(ref.split_heads(do, nh), cache)
    grad_k_bias = ref.merge_heads(dk).reshape(-1, bias.size).sum(axis=0)  # dL/db_k, like a bias's
    grad_v_bias = ref.merge_heads(dv).reshape(-1, bias.size).sum(axis=0)
    # the gradient is a sum of terms of order 1 that cancel exactly: only roundoff is left
    assert_matches_reference(grad_k_bias, np.zeros_like(bias), name="gradient of a key bias")
    # while the same bias on the queries, or the value bias's gradient, are anything but zero
    assert np.abs(attend(np.resize(bias, H), 0)[0] - o_without).max() > 1e-2
    assert np.abs(grad_v_bias).max() > 1e-2
