"""Shard/gather helpers of the numpy TP layers: exact round trips, GQA placement, clear errors."""
import numpy as np
import pytest

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_all_match, assert_matches_reference
from tp_from_scratch.layers import attention, block, linear, mlp
from tp_from_scratch.layers import reference as ref
from tp_from_scratch.testing import rank_rng


@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_mlp_round_trip_is_exact(t):
    params = ref.init_mlp_params(rank_rng(1), hidden=5, ffn=12)
    local = [mlp.shard_mlp_params(params, t, r) for r in range(t)]
    assert local[0]["fc.weight"].shape == (5, 12 // t) and local[0]["proj.weight"].shape == (12 // t, 5)
    assert_all_match(mlp.gather_mlp_params(local), params, exact=True)


@pytest.mark.parametrize("t,n_heads,n_kv_heads", [
    (1, 4, 2), (2, 4, 4), (2, 4, 2), (2, 4, 1), (3, 6, 3), (3, 6, 1), (4, 8, 4), (4, 4, 2), (4, 8, 1)])
def test_attention_round_trip_is_exact(t, n_heads, n_kv_heads):
    params = ref.init_attention_params(rank_rng(2), 2 * n_heads, n_heads, n_kv_heads)
    local = [attention.shard_attention_params(params, n_heads, n_kv_heads, t, r) for r in range(t)]
    assert_all_match(attention.gather_attention_params(local, n_heads, n_kv_heads), params, exact=True)


def test_block_round_trip_is_exact():
    config = ref.BlockConfig(hidden=8, n_heads=4, n_kv_heads=2, ffn=12)
    params = ref.init_block_params(rank_rng(3), config)
    local = [block.shard_block_params(params, config, 4, r) for r in range(4)]
    assert_all_match(block.gather_block_params(local, config), params, exact=True)
    # shards are copies: a rank that updates its shard in place never touches the full params
    assert not any(np.shares_memory(p[k], params[k]) for p in local for k in p)


def test_each_rank_holds_the_kv_heads_its_query_heads_read():
    # query head j reads KV head j // (nh / nkv); the local attention must find it locally
    hs = 2
    for t, nh, nkv in [(2, 4, 2), (4, 4, 2), (4, 8, 1), (2, 8, 4), (4, 8, 2)]:
        for r in range(t):
            first, count = attention.kv_heads_of_rank(nh, nkv, t, r)
            needed = {j // (nh // nkv) for j in range(r * nh // t, (r + 1) * nh // t)}
            assert needed == set(range(first, first + count)), (t, nh, nkv, r)
        # and the columns handed out are those heads' columns
        params = ref.init_attention_params(rank_rng(4), 8, nh, nkv, head_size=hs)
        for r in range(t):
            first, count = attention.kv_heads_of_rank(nh, nkv, t, r)
            local = attention.shard_attention_params(params, nh, nkv, t, r)
            for key in ("k.weight", "v.weight"):
                assert_matches_reference(local[key], params[key][:, first * hs:(first + count) * hs],
                                         name=key, rank=r, exact=True)


def test_replicated_kv_gradients_are_summed_when_gathered():
    # 4 ranks, 2 KV heads: ranks 0,1 share KV head 0 and ranks 2,3 share KV head 1
    rng = rank_rng(5)
    grads = [{k: rng.standard_normal(s) for k, s in
              [("q.weight", (4, 2)), ("q.bias", (2,)), ("k.weight", (4, 2)), ("v.weight", (4, 2)),
               ("v.bias", (2,)), ("o.weight", (2, 4))]} for _ in range(4)]
    o_bias = rng.standard_normal(4)
    for g in grads:
        g["o.bias"] = o_bias.copy()
    full = attention.gather_attention_grads(grads, n_heads=4, n_kv_heads=2)
    assert_matches_reference(full["k.weight"][:, :2], grads[0]["k.weight"] + grads[1]["k.weight"],
                             name="k.weight head 0")
    assert_matches_reference(full["v.bias"][2:], grads[2]["v.bias"] + grads[3]["v.bias"], name="v.bias head 1")
    # while parameters (not gradients) must be equal copies: unequal ones are refused
    with pytest.raises(ValueError, match="replicated k.weight of ranks \\[0, 1\\] differs"):
        attention.gather_attention_params(grads, n_heads=4, n_kv_heads=2)


def test_replicated_copies_that_drifted_are_refused():
    params = ref.init_mlp_params(rank_rng(6), hidden=4, ffn=8)
    local = [mlp.shard_mlp_params(params, 2, r) for r in range(2)]
    local[1]["proj.bias"][0] += 1e-12
    with pytest.raises(ValueError, match="replicated proj.bias differs between rank 0 and rank 1"):
        mlp.gather_mlp_params(local)


@pytest.mark.parametrize("call,message", [
    (lambda p: mlp.shard_mlp_params(p["mlp"], 4, 0), "ffn size 10 is not divisible by tp=4"),
    (lambda p: attention.shard_attention_params(p["attn"], 6, 6, 4, 0),
     "number of heads 6 is not divisible by tp=4"),
    (lambda p: attention.shard_attention_params(p["attn"], 6, 4, 2, 0),
     "number of heads 6 is not divisible by number of KV heads 4"),
    (lambda p: attention.kv_heads_of_rank(12, 6, 4, 0), "number of KV heads 6 is not divisible by tp=4"),
    (lambda p: attention.kv_heads_of_rank(6, 2, 3, 0), "number of KV heads 2 does not divide tp=3"),
    (lambda p: attention.kv_heads_of_rank(4, 2, 2, 2), "rank 2 does not exist for tp=2"),
    (lambda p: linear.shard_row_parallel_linear(p["w"], None, 3, 0, "hidden size"),
     "hidden size 10 is not divisible by tp=3"),
    (lambda p: linear.shard_column_parallel_linear(p["w"], None, 4, 0),
     "output features 6 is not divisible by tp=4"),
    (lambda p: mlp.shard_mlp_params(p["mlp"], 0, 0), "tp degree must be at least 1"),
    (lambda p: ref.BlockConfig(hidden=10, n_heads=4, n_kv_heads=2, ffn=8),
     "hidden size 10 is not divisible by number of heads 4"),
    (lambda p: ref.BlockConfig(hidden=12, n_heads=4, n_kv_heads=3, ffn=8),
     "number of heads 4 is not divisible by number of KV heads 3"),
    (lambda p: block.shard_block_params(
        ref.init_block_params(rank_rng(0), p["config"]), p["config"], 4, 0),
     "ffn size 6 is not divisible by tp=4"),
])
def test_sizes_tp_does_not_divide_raise_a_value_error_naming_the_quantity(call, message):
    rng = rank_rng(7)
    p = {"mlp": ref.init_mlp_params(rng, hidden=4, ffn=10),
         "attn": ref.init_attention_params(rng, 12, 6, 6),
         "w": rng.standard_normal((10, 6)),
         "config": ref.BlockConfig(hidden=8, n_heads=4, n_kv_heads=2, ffn=6)}
    with pytest.raises(ValueError, match=message):
        call(p)


def test_layers_never_modify_their_inputs():
    # the reference and the parallel block leave x, dy and every parameter untouched
    rng = rank_rng(8)
    config = ref.BlockConfig(hidden=8, n_heads=4, n_kv_heads=2, ffn=12)
    params = ref.init_block_params(rng, config)
    x, dy = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 3, 8))
    saved = {k: v.copy() for k, v in params.items()}, x.copy(), dy.copy()
    ref.block_backward(dy, ref.block_forward(x, params, config)[1])

    def parallel(comm):
        local = block.shard_block_params(params, config, comm.world_size, comm.rank)
        before = {k: v.copy() for k, v in local.items()}
        block.parallel_block_backward(comm, dy, block.parallel_block_forward(comm, x, local, config)[1])
        assert_all_match(local, before, rank=comm.rank, exact=True)

    run_spmd(parallel, 2)
    assert_all_match(params, saved[0], exact=True)
    assert_matches_reference(x, saved[1], name="x", exact=True)
    assert_matches_reference(dy, saved[2], name="dy", exact=True)
