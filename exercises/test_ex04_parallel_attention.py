"""Graders for Exercise 4: causal self-attention split by heads, grouped-query attention included.

The grader shards the full parameters itself, following the layout the stub's docstring
specifies, so each test checks one function: the sharding helper against that layout,
and the parallel forward/backward against the single-device reference
(tp_from_scratch.layers.reference) for outputs AND every gradient. The meter must show
one all-reduce forward and one backward (at t = 1 skipping them passes too). Every array
handed in must be unchanged afterwards and every result a new array. causal_attention is
graded on its own first, with scores in the thousands (a softmax without the max
subtraction overflows).
"""
import numpy as np
import pytest

from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.tools.grading import assert_not_aliased, collective_calls, expected_calls, run_graded
from tp_from_scratch.layers import reference
from tp_from_scratch.testing import random_array, rank_rng

B, T, H, HS = 2, 5, 8, 12  # head size 12: divisible by every t below

# (t, nh, nkv): KV heads sharded (t divides nkv) and replicated (nkv < t), and t = 3
CONFIGS = [
    (1, 4, 2),
    (2, 4, 4), (2, 4, 2), (2, 4, 1),
    (3, 6, 6), (3, 6, 3), (3, 6, 1),
    (4, 4, 4), (4, 4, 2), (4, 4, 1),
]
CONFIG_IDS = [f"t{t}-nh{nh}-nkv{nkv}" for t, nh, nkv in CONFIGS]
KV_KEYS = ("k.weight", "v.weight", "v.bias")


def head_columns(first, count):
    """The column indices of `count` heads starting at head `first` (head j owns j*hs:(j+1)*hs)."""
    return np.arange(first * HS, (first + count) * HS)


def kv_heads_of(rank, t, nkv):
    """(first KV head, how many) that rank `rank` holds."""
    if nkv >= t:
        return rank * (nkv // t), nkv // t
    return rank // (t // nkv), 1  # nkv < t: t/nkv consecutive ranks share one KV head


def expected_shard(params, t, nh, nkv, rank):
    """The grader's own statement of the layout: rank r's query heads and the KV heads they read."""
    q_cols = head_columns(rank * (nh // t), nh // t)
    kv_cols = head_columns(*kv_heads_of(rank, t, nkv))
    return {
        "q.weight": params["q.weight"][:, q_cols], "q.bias": params["q.bias"][q_cols],
        "k.weight": params["k.weight"][:, kv_cols],  # no key bias, as in the torch GPT
        "v.weight": params["v.weight"][:, kv_cols], "v.bias": params["v.bias"][kv_cols],
        "o.weight": params["o.weight"][q_cols, :], "o.bias": params["o.bias"],
    }


def full_params(seed, nh, nkv, dtype):
    return reference.init_attention_params(rank_rng(seed, nh * 10 + nkv), H, nh, nkv, head_size=HS, dtype=dtype)


def softmax_hint(got):
    """A hint when the attention came out non-finite: the signature of exp without the max subtraction."""
    values = np.asarray(got)
    if values.size and not np.all(np.isfinite(values)):
        return ("\nHint: the result holds inf or nan: exp overflowed. Subtract each row's max score "
                "before exp (softmax is unchanged by it)")
    return ""


# (nh, nkv, scale of q and k): scale 100 makes the scores about 10^4, where exp overflows
ATTENTION_CASES = [(4, 4, 1.0), (6, 2, 1.0), (6, 3, 100.0), (4, 1, 100.0)]


@pytest.mark.parametrize("nh,nkv,scale", ATTENTION_CASES, ids=[f"nh{a}-nkv{b}-x{c:g}" for a, b, c in ATTENTION_CASES])
def test_causal_attention_matches_single_device(impl, nh, nkv, scale):
    rng = rank_rng(44, nh * 10 + nkv)
    q = scale * random_array(rng, (B, nh, T, HS))
    k, v = scale * random_array(rng, (B, nkv, T, HS)), random_array(rng, (B, nkv, T, HS))
    copies = [q.copy(), k.copy(), v.copy()]
    expected, _ = reference.causal_attention_forward(*copies)
    got = impl.causal_attention(q, k, v)
    try:
        assert_matches_reference(got, expected, name="causal attention output")
    except AssertionError as error:
        raise AssertionError(f"{error}{softmax_hint(got)}") from None
    for name, given, copy in zip("qkv", (q, k, v), copies):
        assert_matches_reference(given, copy, name=f"{name} (must not be modified)", exact=True)
    assert_not_aliased(got, [q, k, v], "causal_attention's result")


@pytest.mark.parametrize("t,nh,nkv", CONFIGS, ids=CONFIG_IDS)
def test_shard_attention_params_gives_each_rank_its_heads(impl, t, nh, nkv):
    params = full_params(40, nh, nkv, np.float64)
    before = {k: v.copy() for k, v in params.items()}
    for rank in range(t):
        got = impl.shard_attention_params(params, nh, nkv, t, rank)
        expected = expected_shard(params, t, nh, nkv, rank)
        assert set(got) == set(expected), f"rank {rank}: keys {sorted(got)}, expected {sorted(expected)}"
        for key in expected:  # moving data only: demand every bit
            assert_matches_reference(got[key], expected[key], name=key, rank=rank, exact=True)
            # a rank owns its shard: a copy, so training it cannot change the full params
            assert_not_aliased(got[key], list(params.values()), f"shard of {key}", rank)
    for key in before:
        assert_matches_reference(params[key], before[key], name=f"{key} (must not be modified)", exact=True)


@pytest.mark.parametrize("nh,nkv,t,quantity", [(6, 6, 4, "6"), (6, 3, 2, "3"), (12, 2, 3, "2")])
def test_shard_attention_params_rejects_heads_that_do_not_split(impl, nh, nkv, t, quantity):
    params = full_params(41, nh, nkv, np.float64)
    with pytest.raises(ValueError) as error:
        impl.shard_attention_params(params, nh, nkv, t, 0)
    message = str(error.value)
    # the message must name the head count and the TP degree so the learner can act on it
    assert quantity in message and str(t) in message, f"unhelpful message: {message!r}"


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("t,nh,nkv", CONFIGS, ids=CONFIG_IDS)
def test_parallel_attention_matches_single_device(impl, t, nh, nkv, dtype):
    grade_parallel_attention(impl, t, nh, nkv, dtype)


def test_parallel_attention_with_scores_in_the_thousands(impl):
    # x of size 30 makes the scores ~ 10^4: only a stable softmax survives
    grade_parallel_attention(impl, 3, 6, 3, np.float64, scale=30.0)


def grade_parallel_attention(impl, t, nh, nkv, dtype, scale=1.0):
    params = full_params(42, nh, nkv, dtype)
    rng = rank_rng(43, t)
    x, dy = scale * random_array(rng, (B, T, H), dtype), random_array(rng, (B, T, H), dtype)
    y_ref, cache_ref = reference.attention_forward(x, params, nh, nkv)
    dx_ref, grads_ref = reference.attention_backward(dy, cache_ref)
    shards = [expected_shard(params, t, nh, nkv, r) for r in range(t)]
    copies = [{k: v.copy() for k, v in shard.items()} for shard in shards]
    x_before, dy_before = x.copy(), dy.copy()

    def on_rank(comm):
        given_dy = dy.copy()
        comm.meter.reset()
        y, cache = impl.parallel_attention_forward(comm, x, shards[comm.rank], nh, nkv)
        forward_calls = collective_calls(comm)
        comm.meter.reset()
        dx, grads = impl.parallel_attention_backward(comm, given_dy, cache)
        assert_matches_reference(given_dy, dy, name="dy (must not be modified)", rank=comm.rank, exact=True)
        assert_not_aliased([y, dx, *grads.values()], [x, given_dy, *shards[comm.rank].values()],
                           "attention outputs", comm.rank)
        return y, dx, grads, forward_calls, collective_calls(comm)

    results = run_graded(on_rank, t)
    assert_matches_reference(x, x_before, name="x (must not be modified)", exact=True)
    assert_matches_reference(dy, dy_before, name="dy (must not be modified)", exact=True)
    for rank, (y, dx, grads, forward_calls, backward_calls) in enumerate(results):
        for key in copies[rank]:
            assert_matches_reference(shards[rank][key], copies[rank][key], name=f"{key} (must not be modified)",
                                     rank=rank, exact=True)
        # every rank ends with the full single-device output and input gradient
        try:
            assert_matches_reference(y, y_ref, name="y", rank=rank)
        except AssertionError as error:
            raise AssertionError(f"{error}{softmax_hint(y)}") from None
        assert_matches_reference(dx, dx_ref, name="dx", rank=rank)
        assert set(grads) == set(shards[rank]), f"rank {rank}: gradient keys {sorted(grads)}"
        # query heads and the output projection belong to one rank: their gradients are shards
        expected = expected_shard(grads_ref, t, nh, nkv, rank)
        for key in ("q.weight", "q.bias", "o.weight", "o.bias"):
            assert_matches_reference(grads[key], expected[key], name=f"grad of {key}", rank=rank)
        if nkv >= t:  # each KV head lives on one rank
            for key in KV_KEYS:
                assert_matches_reference(grads[key], expected[key], name=f"grad of {key}", rank=rank)
        assert forward_calls in expected_calls(t, {"all_reduce": 1}), f"rank {rank}: forward made {forward_calls}"
        assert backward_calls in expected_calls(t, {"all_reduce": 1}), f"rank {rank}: backward made {backward_calls}"
    if nkv < t:
        # a replicated KV head: each copy's gradient covers its rank's query heads; together
        # they must add up to the single-device gradient of that head
        for head in range(nkv):
            holders = [r for r in range(t) if kv_heads_of(r, t, nkv)[0] == head]
            cols = head_columns(head, 1)
            for key in KV_KEYS:
                total = sum(results[r][2][key] for r in holders)
                assert_matches_reference(total, grads_ref[key][..., cols],
                                         name=f"grad of {key} (KV head {head}, summed over ranks {holders})")
