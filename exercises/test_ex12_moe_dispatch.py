"""Graders for Exercise 12: expert parallelism's all-to-all, dispatch and combine.

Each test runs the implementation on p simulated ranks (run_spmd) with rank-distinct random
data (rank_rng(seed, rank)) and compares with a single-device computation written here in
plain numpy: every token through its k experts (expert e multiplies by its own matrix W_e),
weighted by its normalised scores. Integer-valued rows travel and are summed exactly, so the
all-to-all checks are bit for bit.
"""
import copy

import numpy as np
import pytest

from tp_from_scratch.comm import SPMDError
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.testing import random_array, rank_rng
from tp_from_scratch.tools.grading import assert_not_aliased, run_graded

WORLD_SIZES = range(1, 7)  # 3 and 5: odd
GRADER_TIMEOUT = 10.0


def spmd(fn, p):
    return run_graded(fn, p, timeout=GRADER_TIMEOUT)


# ---------------------------------------------------------------- all_to_all_v

def counts_of(seed, p):
    return [rank_rng(seed, q).integers(0, 4, size=p) for q in range(p)]  # zeros included


@pytest.mark.parametrize("p", WORLD_SIZES)
def test_all_to_all_v_delivers_each_block_in_source_order(impl, p):
    counts = counts_of(120 + p, p)
    xs = [random_array(rank_rng(121, q), (int(counts[q].sum()), 3), integer=True) for q in range(p)]
    given = [x.copy() for x in xs]
    recv = [np.array([counts[q][r] for q in range(p)]) for r in range(p)]
    out = spmd(lambda comm: impl.all_to_all_v(comm, given[comm.rank], counts[comm.rank], recv[comm.rank]), p)
    for r, y in enumerate(out):
        blocks = [np.split(xs[q], np.cumsum(counts[q])[:-1])[r] for q in range(p)]
        assert_matches_reference(y, np.concatenate(blocks), name=f"all_to_all_v p={p}", rank=r, exact=True)
        assert_matches_reference(given[r], xs[r], name="x after all_to_all_v (must be untouched)", rank=r, exact=True)
        assert not np.shares_memory(y, given[r]), f"rank {r}: the result is a view of x, not a new array"


@pytest.mark.parametrize("p", [2, 3, 5])
def test_all_to_all_v_sends_only_the_rows_that_leave(impl, p):
    counts = counts_of(130 + p, p)
    recv = [np.array([counts[q][r] for q in range(p)]) for r in range(p)]

    def fn(comm):
        c = counts[comm.rank]
        impl.all_to_all_v(comm, np.ones((int(c.sum()), 4)), c, recv[comm.rank])
        return comm.meter.bytes_sent

    for r, sent in enumerate(spmd(fn, p)):
        expected = (int(counts[r].sum()) - int(counts[r][r])) * 4 * 8
        assert sent == expected, (f"rank {r} sent {sent} bytes; its rows for other ranks are {expected} "
                                  "bytes: send each block once, and keep your own block")


def test_all_to_all_v_keeps_dtype_and_extreme_values(impl):
    p = 3
    x = np.array([[2.0 ** 1000], [-(2.0 ** -1000)], [np.finfo(np.float64).max]])
    out = spmd(lambda comm: impl.all_to_all_v(comm, x, [1, 1, 1], [1, 1, 1]), p)
    for r, y in enumerate(out):
        assert_matches_reference(y, np.repeat(x[r:r + 1], p, axis=0), name="extreme values", rank=r, exact=True)


# ---------------------------------------------------------------- dispatch and combine

def problem(seed, p, n_experts, k, hidden=4, tokens=None, ties=False):
    """Per rank: tokens x (tokens[q], H) (default 5 + q), router scores in (0, 1), a shared
    selection bias; and the experts' matrices W (E, H, H). ties: scores in quarters and no
    bias, so that a token's k-th and (k+1)-th scores are often equal."""
    tokens = [5 + q for q in range(p)] if tokens is None else tokens
    rng = rank_rng(seed)
    bias = np.zeros(n_experts) if ties else rng.normal(0, 0.3, n_experts)
    W = rng.normal(0, 1, (n_experts, hidden, hidden))
    xs = [random_array(rank_rng(seed + 1, q), (n, hidden), integer=True) for q, n in enumerate(tokens)]
    if ties:
        scores = [rank_rng(seed + 2, q).integers(1, 4, size=(n, n_experts)) / 4 for q, n in enumerate(tokens)]
    else:
        scores = [1 / (1 + np.exp(-rank_rng(seed + 2, q).normal(size=(n, n_experts)))) for q, n in enumerate(tokens)]
    return xs, scores, bias, W


def chosen_experts(scores, bias, k):
    """(N, k): the stub's rule, ties to the lower expert id."""
    return np.argsort(-(scores + bias), axis=1, kind="stable")[:, :k]


def single_device(x, scores, bias, W, k):
    """Every token through its k experts (chosen by scores + bias), weighted by its normalised scores."""
    experts = chosen_experts(scores, bias, k)
    chosen = np.take_along_axis(scores, experts, axis=1)
    weights = chosen / chosen.sum(1, keepdims=True)
    y = np.zeros(x.shape)
    for n, (xn, wn, en) in enumerate(zip(x, weights, experts)):
        y[n] = sum(w * (xn @ W[e]) for w, e in zip(wn, en))
    return y


def expected_dispatch(xs, scores, bias, k, n_experts, p, r):
    """(rows, local_expert) rank r must receive: from each source in order, its pairs for rank
    r's experts, by expert (pairs of one expert in token order)."""
    per_rank, rows, local = n_experts // p, [], []
    for q in range(p):
        experts = chosen_experts(scores[q], bias, k).reshape(-1)
        order = np.argsort(experts, kind="stable")
        mine = order[experts[order] // per_rank == r]
        rows.append(xs[q][mine // k])
        local.append(experts[mine] - r * per_rank)
    return np.concatenate(rows), np.concatenate(local)


PLAN_FIELDS = ("experts", "order", "send_counts", "recv_counts")


def require(condition, message):
    """An AssertionError with ``message`` alone (no pytest rewrite of the condition)."""
    if not condition:
        raise AssertionError(message)


def check_dispatched(rank, x, rows, local, plan, k, n_experts, p):
    """What the experts and combine rely on: integer ids and counts, local_expert in range."""
    ids = [("local_expert", local)] + [(f"plan.{f}", getattr(plan, f)) for f in PLAN_FIELDS]
    for name, value in ids:
        dtype = np.asarray(value).dtype
        require(np.issubdtype(dtype, np.integer),
                f"rank {rank}: {name} has dtype {dtype}: expert ids, positions and counts must be "
                "integer arrays (a float count cannot size a buffer, nor a float id index a row)")
    N, per_rank = len(x), n_experts // p
    local, order = np.asarray(local), np.asarray(plan.order)
    require(local.shape == (len(rows),),
            f"rank {rank}: local_expert has shape {local.shape}; one id per received row: ({len(rows)},)")
    if len(local):
        require(local.min() >= 0 and local.max() < per_rank,
                f"rank {rank}: local_expert must be in [0, E/t) = [0, {per_rank}), got {local.min()}..{local.max()}: "
                f"it is the expert id minus r E/t (rank {rank} owns experts {rank * per_rank} to "
                f"{(rank + 1) * per_rank - 1})")
    require(order.shape == (N * k,) and (np.sort(order) == np.arange(N * k)).all(),
            f"rank {rank}: plan.order must be a permutation of the N k = {N * k} pairs (the pairs' send order)")
    assert_not_aliased(rows, [x], "dispatched rows", rank)


def run_dispatch(impl, xs, scores, bias, k, n_experts, p):
    """dispatch on p ranks, its inputs checked untouched and its ids checked: [(rows, local, plan)]."""
    given = [(x.copy(), s.copy(), bias.copy()) for x, s in zip(xs, scores)]
    out = spmd(lambda comm: impl.dispatch(comm, *given[comm.rank], k, n_experts), p)
    for r, (x, s, b) in enumerate(given):
        for name, now, before in (("x", x, xs[r]), ("scores", s, scores[r]), ("bias", b, bias)):
            assert_matches_reference(now, before, name=f"{name} after dispatch (must be untouched)",
                                     rank=r, exact=True)
        check_dispatched(r, xs[r], *out[r], k, n_experts, p)
    return out


def run_combine(impl, outputs, scores, plans, p):
    """combine on p ranks, every one of its inputs checked untouched afterwards: [y]."""
    given = [(o.copy(), s.copy()) for o, s in zip(outputs, scores)]
    before = [copy.deepcopy({f: np.asarray(getattr(plan, f)) for f in PLAN_FIELDS}) for plan in plans]
    ys = spmd(lambda comm: impl.combine(comm, *given[comm.rank], plans[comm.rank]), p)
    for r, (o, s) in enumerate(given):
        for name, now, was in (("outputs", o, outputs[r]), ("scores", s, scores[r]),
                               *((f"plan.{f}", np.asarray(getattr(plans[r], f)), before[r][f]) for f in PLAN_FIELDS)):
            assert_matches_reference(now, was, name=f"{name} after combine (must be untouched)", rank=r, exact=True)
        assert_not_aliased(ys[r], [o], "combine's result", r)
    return ys


def ep_forward(impl, xs, scores, bias, W, k, p):
    """Dispatch, every received row through its expert (here, in the grader), combine:
    [(rows, local_expert, y)] per rank."""
    E = len(W)
    dispatched = run_dispatch(impl, xs, scores, bias, k, E, p)
    outputs = []
    for r, (rows, local, _) in enumerate(dispatched):
        first = r * (E // p)
        outputs.append(np.stack([row @ W[first + int(e)] for row, e in zip(rows, local)]) if len(rows)
                       else np.zeros((0, xs[r].shape[1])))
    ys = run_combine(impl, outputs, scores, [plan for _, _, plan in dispatched], p)
    return [(rows, local, y) for (rows, local, _), y in zip(dispatched, ys)]


def check_rows(impl_out, xs, scores, bias, k, n_experts, p, hint=""):
    for r, (rows, local, _) in enumerate(impl_out):
        expected_rows, expected_local = expected_dispatch(xs, scores, bias, k, n_experts, p, r)
        try:
            assert_matches_reference(rows, expected_rows, name="dispatched rows", rank=r, exact=True)
            assert_matches_reference(np.asarray(local).astype(np.int64), expected_local,
                                     name="local expert of each row", rank=r, exact=True)
        except AssertionError as error:
            raise AssertionError(f"{error}{hint}") from None


DISPATCH_CASES = [(1, 4, 2), (2, 8, 3), (3, 6, 2), (4, 8, 2), (5, 10, 3), (6, 12, 4)]  # every promised t


@pytest.mark.parametrize("p, n_experts, k", DISPATCH_CASES)
def test_dispatch_sends_each_pair_to_its_experts_rank_in_order(impl, p, n_experts, k):
    xs, scores, bias, W = problem(140 + p, p, n_experts, k)
    check_rows(ep_forward(impl, xs, scores, bias, W, k, p), xs, scores, bias, k, n_experts, p)


@pytest.mark.parametrize("p, n_experts, k", [(1, 4, 2), (3, 6, 2), (4, 8, 3)])
def test_combine_returns_each_row_to_its_token_with_weights_that_sum_to_one(impl, p, n_experts, k):
    # every expert the identity: each token must get back exactly its own x, times weights
    # that sum to one; anything else names the step that broke
    xs, scores, bias, _ = problem(155 + p, p, n_experts, k)
    W = np.broadcast_to(np.eye(xs[0].shape[1]), (n_experts, *xs[0].shape[1:] * 2))
    for r, (_, _, y) in enumerate(ep_forward(impl, xs, scores, bias, W, k, p)):
        x = xs[r]
        require(y.shape == x.shape, f"rank {r}: combine returned shape {y.shape}, expected {x.shape} (N, H)")
        bad = [n for n in range(len(x)) if not np.allclose(y[n], x[n], rtol=1e-12, atol=1e-12)]
        if not bad:
            continue
        n = bad[0]
        f = float(y[n] @ x[n] / (x[n] @ x[n])) if x[n] @ x[n] else np.nan
        if np.isfinite(f) and np.allclose(y[n], f * x[n], rtol=1e-9, atol=1e-12):
            raise AssertionError(
                f"rank {r}: with every expert the identity, token {n}'s output is {f:.6g} times its input, "
                "not once: its k weights must sum to one (w = s / the sum of its k chosen scores, the bias "
                "left out), and each weight be applied once")
        raise AssertionError(
            f"rank {r}: with every expert the identity, token {n} got back rows that are not its own: check "
            "combine's inverse permutation (the returned rows arrive in send order: the i-th is pair "
            "plan.order[i], of token plan.order[i] // k)")


@pytest.mark.parametrize("p", [2, 3])
def test_tied_scores_choose_the_lower_expert_id(impl, p):
    n_experts, k = 4 * p, 3
    xs, scores, bias, W = problem(145 + p, p, n_experts, k, ties=True)
    out = ep_forward(impl, xs, scores, bias, W, k, p)
    hint = ("\nHint: scores here come in quarters, so a token's k-th and (k+1)-th scores tie: the stub's "
            "rule keeps the lower expert id, np.argsort(-(scores + bias), axis=1, kind=\"stable\")[:, :k]")
    check_rows(out, xs, scores, bias, k, n_experts, p, hint)
    for r, (_, _, y) in enumerate(out):
        assert_matches_reference(y, single_device(xs[r], scores[r], bias, W, k), name="MoE output with ties", rank=r)


@pytest.mark.parametrize("p, n_experts, k", DISPATCH_CASES)
def test_combine_gives_every_token_the_single_device_output(impl, p, n_experts, k):
    xs, scores, bias, W = problem(150 + p, p, n_experts, k)
    for r, (_, _, y) in enumerate(ep_forward(impl, xs, scores, bias, W, k, p)):
        assert_matches_reference(y, single_device(xs[r], scores[r], bias, W, k), name="MoE output", rank=r)


def test_a_huge_bias_selects_but_never_weighs(impl):
    # expert 0's bias makes every token choose it; its weight must stay its (small) score's share
    p, E, k = 2, 4, 2
    xs, scores, bias, W = problem(160, p, E, k)
    bias = bias.copy()
    bias[0] = 1e6
    for r, (_, _, y) in enumerate(ep_forward(impl, xs, scores, bias, W, k, p)):
        assert_matches_reference(y, single_device(xs[r], scores[r], bias, W, k),
                                 name="output with a huge selection bias (the bias must not enter the weights)", rank=r)


def test_a_rank_whose_experts_nobody_chose_still_takes_part(impl):
    # every token picks experts 0 and 1 (rank 0's): rank 1 receives nothing, sends everything
    p, E, k = 2, 4, 2
    xs, scores, bias, W = problem(170, p, E, k)
    bias = np.array([5.0, 4.0, 0.0, 0.0])
    out = ep_forward(impl, xs, scores, bias, W, k, p)
    assert len(out[1][0]) == 0, "rank 1 owns experts 2 and 3, which no token chose"
    for r, (_, _, y) in enumerate(out):
        assert_matches_reference(y, single_device(xs[r], scores[r], bias, W, k), name="MoE output", rank=r)


@pytest.mark.parametrize("tokens, bias", [
    ([4, 0, 5], None),                          # rank 1: an empty micro-batch
    ([0, 6], None),                             # rank 0 sends nothing, still receives
    ([0, 5, 6], [-5.0, -5.0, 0, 0, 0, 0]),      # rank 0: no tokens, and nobody chooses its experts
], ids=["middle-rank-empty", "first-rank-empty", "empty-and-unchosen"])
def test_a_rank_with_no_tokens_still_takes_part(impl, tokens, bias):
    p, k = len(tokens), 2
    E = 2 * p
    xs, scores, default_bias, W = problem(175 + p, p, E, k, tokens=tokens)
    bias = default_bias if bias is None else np.array(bias)
    out = ep_forward(impl, xs, scores, bias, W, k, p)
    check_rows(out, xs, scores, bias, k, E, p)
    for r, (_, _, y) in enumerate(out):
        assert_matches_reference(y, single_device(xs[r], scores[r], bias, W, k),
                                 name=f"MoE output ({tokens[r]} tokens on this rank)", rank=r)


def test_an_expert_count_the_ranks_do_not_divide_is_named(impl):
    xs, scores, bias, W = problem(180, 3, 4, 2)
    with pytest.raises(SPMDError) as info:
        spmd(lambda comm: impl.dispatch(comm, xs[comm.rank], scores[comm.rank][:, :4], bias[:4], 2, 4), 3)
    assert isinstance(info.value.error, ValueError) and "n_experts" in str(info.value.error), (
        f"4 experts on 3 ranks must raise a ValueError naming n_experts, got {info.value.error!r}")
