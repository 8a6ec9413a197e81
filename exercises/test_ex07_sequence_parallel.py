"""Graders for Exercise 7: the sequence-parallel mappings g / g-bar and LayerNorm on a sequence shard.

Every test runs t simulated ranks, t = 1, 2, 3, 4, builds fresh random data, and compares
each rank's result with the matching piece of a single-device computation through the
course's one comparison helper. Sequence lengths include T not divisible by t (array_split
shards); LayerNorm also gets activations around 1e4 in float32. Moving data (all-gather) must be bit-exact; sums use integer-valued data so that
they are exact too. The meter is part of the specification: the collective each direction
makes is counted, and so is the rank order of the shards, untouched inputs and fresh outputs.
"""
import numpy as np
import pytest

from tp_from_scratch.comm import SPMDError
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.layers import reference
from tp_from_scratch.sharding import shard_sizes
from tp_from_scratch.tools.grading import collective_calls, expected_calls, run_graded
from tp_from_scratch.testing import random_array, rank_rng

WORLD_SIZES = [1, 2, 3, 4]
B, H = 2, 6


def seq_lengths(t):
    return sorted({2 * t, 2 * t + 1, 7})  # even shards, one extra position, and T = 7 for every t


def my_positions(array, t, rank):
    """Rank ``rank``'s block of positions of a (B, T, ...) array, array_split rule."""
    return np.array_split(array, t, axis=1)[rank]


def check_calls(got, expected, what, rank, t):
    # at t = 1 a gather or a sum over the group is the input itself: skipping the call is fine
    assert got in expected_calls(t, expected), (
        f"rank {rank}: {what} made the collective calls {got}, expected {expected}")


def fresh(out, inp, what, rank):
    assert not np.shares_memory(out, inp), f"rank {rank}: {what} returned (a view of) its input"


# -- g: all-gather forward, reduce-scatter backward ----------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("t", WORLD_SIZES)
def test_g_forward_gathers_every_position_in_rank_order(impl, t, dtype):
    for T in seq_lengths(t):
        full = random_array(rank_rng(70, T), (B, T, H), dtype)  # the sequence before sharding

        def on_rank(comm):
            x_shard = my_positions(full, t, comm.rank).copy()
            before = x_shard.copy()
            comm.meter.reset()
            y = impl.gather_from_sequence_parallel_region_forward(comm, x_shard)
            assert_matches_reference(x_shard, before, name="x_shard (must not be modified)",
                                     rank=comm.rank, exact=True)
            fresh(y, x_shard, "g forward", comm.rank)
            return y, collective_calls(comm)

        for rank, (y, calls) in enumerate(run_graded(on_rank, t)):
            # moving data only: every bit of the sequence, positions in rank order
            assert_matches_reference(y, full, name=f"g forward (T={T})", rank=rank, exact=True)
            check_calls(calls, {"all_gather": 1}, "g forward", rank, t)


@pytest.mark.parametrize("t", WORLD_SIZES)
def test_g_backward_sums_the_partial_gradients_of_this_ranks_positions(impl, t):
    for T in seq_lengths(t):
        def on_rank(comm):
            grad = random_array(rank_rng(71, comm.rank), (B, T, H), integer=True)  # rank-distinct
            before = grad.copy()
            comm.meter.reset()
            dx = impl.gather_from_sequence_parallel_region_backward(comm, grad)
            assert_matches_reference(grad, before, name="grad (must not be modified)", rank=comm.rank,
                                     exact=True)
            fresh(dx, grad, "g backward", comm.rank)
            return dx, grad, collective_calls(comm)

        results = run_graded(on_rank, t)
        total = np.sum([r[1] for r in results], axis=0)
        for rank, (dx, _, calls) in enumerate(results):
            assert_matches_reference(dx, my_positions(total, t, rank), name=f"g backward (T={T})",
                                     rank=rank, exact=True)
            check_calls(calls, {"reduce_scatter": 1}, "g backward", rank, t)


# -- g-bar: reduce-scatter forward, all-gather backward ------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("t", WORLD_SIZES)
def test_g_bar_forward_reduce_scatters_along_the_sequence(impl, t, dtype):
    for T in seq_lengths(t):
        def on_rank(comm):
            partial = random_array(rank_rng(72, comm.rank), (B, T, H), integer=True).astype(dtype)
            before = partial.copy()
            comm.meter.reset()
            y = impl.reduce_scatter_to_sequence_parallel_region_forward(comm, partial)
            assert_matches_reference(partial, before, name="x_partial (must not be modified)",
                                     rank=comm.rank, exact=True)
            fresh(y, partial, "g-bar forward", comm.rank)
            return y, partial, collective_calls(comm)

        results = run_graded(on_rank, t)
        total = np.sum([r[1] for r in results], axis=0, dtype=dtype)
        for rank, (y, _, calls) in enumerate(results):
            assert_matches_reference(y, my_positions(total, t, rank), name=f"g-bar forward (T={T})",
                                     rank=rank, exact=True)
            check_calls(calls, {"reduce_scatter": 1}, "g-bar forward", rank, t)


@pytest.mark.parametrize("t", WORLD_SIZES)
def test_g_bar_backward_gathers_the_whole_gradient(impl, t):
    for T in seq_lengths(t):
        full = random_array(rank_rng(73, T), (B, T, H))

        def on_rank(comm):
            grad_shard = my_positions(full, t, comm.rank).copy()
            comm.meter.reset()
            dx = impl.reduce_scatter_to_sequence_parallel_region_backward(comm, grad_shard)
            fresh(dx, grad_shard, "g-bar backward", comm.rank)
            return dx, collective_calls(comm)

        for rank, (dx, calls) in enumerate(run_graded(on_rank, t)):
            assert_matches_reference(dx, full, name=f"g-bar backward (T={T})", rank=rank, exact=True)
            check_calls(calls, {"all_gather": 1}, "g-bar backward", rank, t)


@pytest.mark.parametrize("t", [2, 3, 4])
def test_g_and_g_bar_are_transposes(impl, t):
    # <g(x), y> summed over ranks equals <x, g^T(y)>: the defining property of a backward
    T = 2 * t + 1

    def on_rank(comm):
        x = random_array(rank_rng(74, comm.rank), (B, shard_sizes(T, t)[comm.rank], H), integer=True)
        y = random_array(rank_rng(75, comm.rank), (B, T, H), integer=True)
        gx = impl.gather_from_sequence_parallel_region_forward(comm, x)
        gty = impl.gather_from_sequence_parallel_region_backward(comm, y)
        return float(np.sum(gx * y)), float(np.sum(x * gty))

    results = run_graded(on_rank, t)
    lhs, rhs = sum(r[0] for r in results), sum(r[1] for r in results)
    assert lhs == rhs, f"<g(x), y> = {lhs} but <x, g backward(y)> = {rhs}"


@pytest.mark.parametrize("which", ["gather_from_sequence_parallel_region_forward",
                                   "reduce_scatter_to_sequence_parallel_region_backward"])
def test_a_shard_that_breaks_the_array_split_rule_is_refused(impl, which):
    # T = 4 over 2 ranks gives 2 + 2; here rank 0 holds 1 position and rank 1 holds 3
    def on_rank(comm):
        return getattr(impl, which)(comm, np.zeros((B, 1 + 2 * comm.rank, H)))

    try:
        run_graded(on_rank, 2)
    except SPMDError as error:
        caught = pytest.ExceptionInfo.from_exception(error)
    else:
        pytest.fail(f"{which} accepted shards of 1 and 3 positions (T = 4 on 2 ranks), where the "
                    f"array_split rule gives 2 and 2: check each rank's shard length and raise a "
                    f"ValueError that names the rank")
    assert isinstance(caught.value.error, ValueError), f"expected a ValueError, got {caught.value.error!r}"
    assert "rank" in str(caught.value.error), f"the error should name the rank: {caught.value.error}"


# -- LayerNorm on a sequence shard ---------------------------------------------------------

@pytest.mark.parametrize("scale", [1.0, 1e4])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("t", WORLD_SIZES)
def test_layernorm_on_a_shard_with_all_reduced_weight_and_bias_gradients(impl, t, dtype, scale):
    T = 2 * t + 1  # uneven shards
    rng = rank_rng(76, t)
    # scale: large activations with a large offset, where a careless variance loses every digit
    x = (scale * (1 + random_array(rng, (B, T, H)))).astype(dtype)
    dy = random_array(rng, (B, T, H), dtype)
    w, b = random_array(rng, (H,), dtype), random_array(rng, (H,), dtype)
    y_ref, cache_ref = reference.layernorm_forward(x, w, b)
    dx_ref, dw_ref, db_ref = reference.layernorm_backward(dy, cache_ref)

    def on_rank(comm):
        x_shard, dy_shard = my_positions(x, t, comm.rank).copy(), my_positions(dy, t, comm.rank).copy()
        w_in, b_in = w.copy(), b.copy()
        comm.meter.reset()
        y, cache = impl.sequence_parallel_layernorm_forward(comm, x_shard, w_in, b_in)
        forward_calls = collective_calls(comm, reset=True)
        dx, dw, db = impl.sequence_parallel_layernorm_backward(comm, dy_shard, cache)
        for name, got, expected in [("x_shard", x_shard, my_positions(x, t, comm.rank)),
                                    ("dy_shard", dy_shard, my_positions(dy, t, comm.rank)),
                                    ("weight", w_in, w), ("bias", b_in, b)]:
            assert_matches_reference(got, expected, name=f"{name} (must not be modified)",
                                     rank=comm.rank, exact=True)
        for name, out in [("dx", dx), ("dweight", dw), ("dbias", db)]:
            fresh(out, dy_shard, name, comm.rank)
        return y, dx, dw, db, forward_calls, collective_calls(comm)

    results = run_graded(on_rank, t)
    for rank, (y, dx, dw, db, forward_calls, backward_calls) in enumerate(results):
        assert_matches_reference(y, my_positions(y_ref, t, rank), name="y_shard", rank=rank)
        assert_matches_reference(dx, my_positions(dx_ref, t, rank), name="dx_shard", rank=rank)
        # a rank's positions alone give only part of dweight and dbias: they must be summed
        assert_matches_reference(dw, dw_ref, name="dweight", rank=rank)
        assert_matches_reference(db, db_ref, name="dbias", rank=rank)
        # Replicated weights must get bit-identical gradients, or they drift apart
        assert_matches_reference(dw, results[0][2], name="dweight vs rank 0", rank=rank, exact=True)
        assert_matches_reference(db, results[0][3], name="dbias vs rank 0", rank=rank, exact=True)
        check_calls(forward_calls, {}, "LayerNorm forward", rank, t)
        check_calls(backward_calls, {"all_reduce": 1}, "LayerNorm backward", rank, t)


@pytest.mark.parametrize("t", [1, 3])
def test_layernorm_uses_the_eps_it_is_given(impl, t):
    # activations with a variance near 0.01: eps = 0.1 changes every output by ~3x, so an eps
    # left at the default 1e-5 cannot pass
    eps, T = 0.1, 2 * t + 1
    rng = rank_rng(78, t)
    x = 0.1 * random_array(rng, (B, T, H))
    dy = random_array(rng, (B, T, H))
    w, b = random_array(rng, (H,)), random_array(rng, (H,))
    y_ref, cache_ref = reference.layernorm_forward(x, w, b, eps)
    dx_ref = reference.layernorm_backward(dy, cache_ref)[0]

    def on_rank(comm):
        y, cache = impl.sequence_parallel_layernorm_forward(comm, my_positions(x, t, comm.rank).copy(), w, b, eps=eps)
        dx = impl.sequence_parallel_layernorm_backward(comm, my_positions(dy, t, comm.rank).copy(), cache)[0]
        return y, dx

    for rank, (y, dx) in enumerate(run_graded(on_rank, t)):
        for name, got, expected in [("y_shard", y, y_ref), ("dx_shard", dx, dx_ref)]:
            try:
                assert_matches_reference(got, my_positions(expected, t, rank), name=f"{name} with eps={eps}", rank=rank)
            except AssertionError as error:
                raise AssertionError(f"{error}\nHint: pass eps on to layernorm_forward (x - mean) / "
                                     "sqrt(var + eps): here var is about 0.01, so eps matters") from None


@pytest.mark.parametrize("t", [1, 3])
def test_layernorm_of_activations_around_1e4_in_float32(impl, t):
    # 1e4 plus small integers, H = 8: a two-pass variance (the mean, then the mean of (x - mean)^2)
    # is exact here in float32, while E[x^2] - E[x]^2 subtracts two numbers near 1e8 that float32
    # keeps to about 8 units: rounding noise, or a negative variance and NaN
    T, H8 = 2 * t + 1, 8
    rng = rank_rng(77, t)
    x = (1e4 + random_array(rng, (B, T, H8), integer=True)).astype(np.float32)
    dy = random_array(rng, (B, T, H8), np.float32)
    w, b = random_array(rng, (H8,), np.float32), random_array(rng, (H8,), np.float32)
    y_ref, cache_ref = reference.layernorm_forward(x, w, b)
    dx_ref = reference.layernorm_backward(dy, cache_ref)[0]

    def on_rank(comm):
        y, cache = impl.sequence_parallel_layernorm_forward(comm, my_positions(x, t, comm.rank).copy(), w, b)
        dx = impl.sequence_parallel_layernorm_backward(comm, my_positions(dy, t, comm.rank).copy(), cache)[0]
        return y, dx

    hint = ("Hint: at activations around 1e4 in float32, compute the variance as the mean of "
            "(x - mean)^2; E[x^2] - E[x]^2 subtracts two nearly equal large numbers")
    for rank, (y, dx) in enumerate(run_graded(on_rank, t)):
        for name, got, expected in [("y_shard", y, y_ref), ("dx_shard", dx, dx_ref)]:
            try:
                assert_matches_reference(got, my_positions(expected, t, rank), name=f"{name} (inputs near 1e4)",
                                         rank=rank)
            except AssertionError as error:
                raise AssertionError(f"{error}\n{hint}") from None
