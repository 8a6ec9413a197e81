"""Graders for Exercise 3: f and g, column- and row-parallel linear layers, the parallel MLP.

Every test runs t simulated ranks (run_spmd, threads in one process), builds fresh random
data, and compares each rank's outputs AND gradients with the matching piece of the
single-device reference (tp_from_scratch.layers.reference) through the course's one
comparison helper. Each test also reads the rank's meter: the number of all-reduces is
part of the specification, so an extra or a missing one fails even if the numbers agree
(at t = 1 a rank may skip the collective, as Megatron-LM does: a sum over one rank is its
input). Every array handed in (inputs, weights, incoming gradients) must be unchanged
afterwards, and every layer output must be a new array. f's forward and g's backward are
identities and may return their input itself (the stub says so).
"""
import numpy as np
import pytest

from tp_from_scratch.compare import assert_all_match, assert_matches_reference
from tp_from_scratch.tools.grading import assert_not_aliased, collective_calls, expected_calls, run_graded
from tp_from_scratch.layers import reference
from tp_from_scratch.sharding import shard
from tp_from_scratch.testing import random_array, rank_rng

WORLD_SIZES = [1, 2, 3, 4]
B, T, H, F = 2, 3, 8, 24  # F = 3H: divisible by every t above


def check_calls(got, expected, what, rank, t):
    allowed = expected_calls(t, expected)
    assert got in allowed, f"rank {rank}: {what} made the collective calls {got}, expected {expected}"


def check_unchanged(arrays, copies, rank):
    """Every array handed to the learner's code must read the same afterwards."""
    for name in copies:
        assert_matches_reference(arrays[name], copies[name], name=f"{name} (must not be modified)",
                                 rank=rank, exact=True)


def row_bias_hint(y, y_ref, b, t):
    """A targeted hint when the row-parallel output is off in the bias's tell-tale way."""
    error = np.asarray(y, np.float64) - y_ref
    if t > 1 and np.allclose(error, (t - 1) * np.asarray(b, np.float64), rtol=1e-4, atol=1e-6):
        return ("y - y_ref = (t-1)*b: the bias was added on every rank before the all-reduce. "
                "Add it once, after the reduction")
    if np.allclose(error, 0, atol=1e-4 * max(1.0, float(np.max(np.abs(y_ref))))):
        return ("y is off only by rounding on integer data, where every order of summation is exact: "
                "a bias split as b/t per rank does that. Add the bias once, after the reduction")
    return ""


def assert_row_output(y, y_ref, b, t, rank, exact):
    try:
        assert_matches_reference(y, y_ref, name="y", rank=rank, exact=exact)
    except AssertionError as error:
        hint = row_bias_hint(y, y_ref, b, t)
        raise AssertionError(f"{error}\nHint: {hint}" if hint else str(error)) from None


def data(rng, shape, dtype):
    if dtype == "integer":  # integer-valued float64: every summation order is exact
        return random_array(rng, shape, np.float64, integer=True)
    return random_array(rng, shape, dtype)


# -- f and g -----------------------------------------------------------------------------

@pytest.mark.parametrize("t", WORLD_SIZES)
def test_f_is_identity_forward_and_all_reduce_backward(impl, t):
    x = random_array(rank_rng(30, t), (B, T, H))  # replicated: the same on every rank

    def on_rank(comm):
        grad = random_array(rank_rng(31, comm.rank), (B, T, H), integer=True)  # rank-distinct
        given = {"x": x.copy(), "grad": grad.copy()}
        comm.meter.reset()
        y = impl.f_forward(comm, given["x"])
        forward_calls = collective_calls(comm)
        comm.meter.reset()
        dx = impl.f_backward(comm, given["grad"])
        check_unchanged(given, {"x": x, "grad": grad}, comm.rank)
        # the all-reduce's result is a new array, at t = 1 too (where it may skip the call)
        assert_not_aliased(dx, [given["grad"]], "f backward", comm.rank)
        return y, dx, grad, forward_calls, collective_calls(comm)

    results = run_graded(on_rank, t)
    grad_sum = np.sum([r[2] for r in results], axis=0)
    for rank, (y, dx, _, forward_calls, backward_calls) in enumerate(results):
        assert_matches_reference(y, x, name="f forward (identity)", rank=rank, exact=True)
        # integer-valued gradients: the sum is exact in any order
        assert_matches_reference(dx, grad_sum, name="f backward (sum over ranks)", rank=rank, exact=True)
        check_calls(forward_calls, {}, "f forward", rank, t)
        check_calls(backward_calls, {"all_reduce": 1}, "f backward", rank, t)


@pytest.mark.parametrize("t", WORLD_SIZES)
def test_g_is_all_reduce_forward_and_identity_backward(impl, t):
    grad = random_array(rank_rng(32, t), (B, T, H))  # dL/dy is replicated

    def on_rank(comm):
        partial = random_array(rank_rng(33, comm.rank), (B, T, H), integer=True)  # rank-distinct
        given = {"partial": partial.copy(), "grad": grad.copy()}
        comm.meter.reset()
        y = impl.g_forward(comm, given["partial"])
        forward_calls = collective_calls(comm)
        comm.meter.reset()
        dx = impl.g_backward(comm, given["grad"])
        check_unchanged(given, {"partial": partial, "grad": grad}, comm.rank)
        assert_not_aliased(y, [given["partial"]], "g forward", comm.rank)  # t = 1 too
        return y, dx, partial, forward_calls, collective_calls(comm)

    results = run_graded(on_rank, t)
    total = np.sum([r[2] for r in results], axis=0)
    for rank, (y, dx, _, forward_calls, backward_calls) in enumerate(results):
        assert_matches_reference(y, total, name="g forward (sum over ranks)", rank=rank, exact=True)
        assert_matches_reference(dx, grad, name="g backward (identity)", rank=rank, exact=True)
        check_calls(forward_calls, {"all_reduce": 1}, "g forward", rank, t)
        check_calls(backward_calls, {}, "g backward", rank, t)


# -- the two linear layers ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("t", WORLD_SIZES)
def test_column_parallel_linear_matches_single_device(impl, t, dtype):
    rng = rank_rng(34, t)
    x, w, b = data(rng, (B, T, H), dtype), data(rng, (H, F), dtype), data(rng, (F,), dtype)
    dy = data(rng, (B, T, F), dtype)
    y_ref, cache_ref = reference.linear_forward(x, w, b)
    dx_ref, dw_ref, db_ref = reference.linear_backward(dy, cache_ref)
    w_shards, b_shards, dy_shards = shard(w, t, 1), shard(b, t, 0), shard(dy, t, -1)

    def on_rank(comm):
        r = comm.rank
        given = {"x": x.copy(), "w_shard": w_shards[r].copy(), "b_shard": b_shards[r].copy(),
                 "dy_local": dy_shards[r].copy()}
        comm.meter.reset()
        y_local, cache = impl.column_parallel_linear_forward(comm, given["x"], given["w_shard"], given["b_shard"])
        forward_calls = collective_calls(comm)
        comm.meter.reset()
        grads = impl.column_parallel_linear_backward(comm, given["dy_local"], cache)
        check_unchanged(given, {"x": x, "w_shard": w_shards[r], "b_shard": b_shards[r], "dy_local": dy_shards[r]}, r)
        assert_not_aliased([y_local, *grads], list(given.values()), "column-parallel outputs", r)
        return y_local, grads, forward_calls, collective_calls(comm)

    y_blocks, dw_blocks, db_blocks = shard(y_ref, t, -1), shard(dw_ref, t, 1), shard(db_ref, t, 0)
    for rank, (y_local, (dx, dw, db), forward_calls, backward_calls) in enumerate(run_graded(on_rank, t)):
        # the output stays sharded: rank r holds column block r of y
        assert_matches_reference(y_local, y_blocks[rank], name="y_local", rank=rank)
        # dx is the full gradient, identical everywhere: the partial dx of each rank, all-reduced
        assert_matches_reference(dx, dx_ref, name="dx", rank=rank)
        assert_matches_reference(dw, dw_blocks[rank], name="dw_shard", rank=rank)
        assert_matches_reference(db, db_blocks[rank], name="db_shard", rank=rank)
        check_calls(forward_calls, {}, "column-parallel forward", rank, t)
        check_calls(backward_calls, {"all_reduce": 1}, "column-parallel backward", rank, t)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, "integer"])
@pytest.mark.parametrize("t", WORLD_SIZES)
def test_row_parallel_linear_matches_single_device(impl, t, dtype):
    rng = rank_rng(35, t)
    x, w, b = data(rng, (B, T, F), dtype), data(rng, (F, H), dtype), data(rng, (H,), dtype)
    dy = data(rng, (B, T, H), dtype)
    y_ref, cache_ref = reference.linear_forward(x, w, b)
    dx_ref, dw_ref, db_ref = reference.linear_backward(dy, cache_ref)
    x_shards, w_shards = shard(x, t, -1), shard(w, t, 0)
    exact = dtype == "integer"  # integer data: the partial sums add up exactly, demand every bit

    def on_rank(comm):
        r = comm.rank
        given = {"x_local": x_shards[r].copy(), "w_shard": w_shards[r].copy(), "b": b.copy(), "dy": dy.copy()}
        comm.meter.reset()
        y, cache = impl.row_parallel_linear_forward(comm, given["x_local"], given["w_shard"], given["b"])
        forward_calls = collective_calls(comm)
        comm.meter.reset()
        grads = impl.row_parallel_linear_backward(comm, given["dy"], cache)
        check_unchanged(given, {"x_local": x_shards[r], "w_shard": w_shards[r], "b": b, "dy": dy}, r)
        assert_not_aliased([y, *grads], list(given.values()), "row-parallel outputs", r)
        return y, grads, forward_calls, collective_calls(comm)

    dx_blocks, dw_blocks = shard(dx_ref, t, -1), shard(dw_ref, t, 0)
    for rank, (y, (dx, dw, db), forward_calls, backward_calls) in enumerate(run_graded(on_rank, t)):
        # y is the sum of the t partial products plus the bias, added once
        assert_row_output(y, y_ref, b, t, rank, exact)
        assert_matches_reference(dx, dx_blocks[rank], name="dx_local", rank=rank, exact=exact)
        assert_matches_reference(dw, dw_blocks[rank], name="dw_shard", rank=rank, exact=exact)
        assert_matches_reference(db, db_ref, name="db", rank=rank, exact=exact)
        check_calls(forward_calls, {"all_reduce": 1}, "row-parallel forward", rank, t)
        check_calls(backward_calls, {}, "row-parallel backward", rank, t)


# -- the MLP ------------------------------------------------------------------------------

def mlp_params(rng, dtype):
    return {"fc.weight": data(rng, (H, F), dtype), "fc.bias": data(rng, (F,), dtype),
            "proj.weight": data(rng, (F, H), dtype), "proj.bias": data(rng, (H,), dtype)}


def mlp_shards(params, t):
    """Rank r's MLP parameters: fc column blocks, proj.weight row blocks, proj.bias replicated."""
    w_fc, b_fc = shard(params["fc.weight"], t, 1), shard(params["fc.bias"], t, 0)
    w_proj = shard(params["proj.weight"], t, 0)
    return [{"fc.weight": w_fc[r], "fc.bias": b_fc[r], "proj.weight": w_proj[r],
             "proj.bias": params["proj.bias"].copy()} for r in range(t)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("t", WORLD_SIZES)
def test_mlp_matches_single_device_with_one_all_reduce_each_way(impl, t, dtype):
    rng = rank_rng(36, t)
    x, dy, params = data(rng, (B, T, H), dtype), data(rng, (B, T, H), dtype), mlp_params(rng, dtype)
    y_ref, cache_ref = reference.mlp_forward(x, params)
    dx_ref, grads_ref = reference.mlp_backward(dy, cache_ref)
    local_params = mlp_shards(params, t)
    expected_grads = mlp_shards(grads_ref, t)  # the gradients shard exactly like the weights...
    for r in range(t):
        expected_grads[r]["proj.bias"] = grads_ref["proj.bias"]  # ...and the replicated proj.bias gets the full gradient
    before = [{k: v.copy() for k, v in p.items()} for p in local_params]

    def on_rank(comm):
        given_dy = dy.copy()
        comm.meter.reset()
        y, cache = impl.parallel_mlp_forward(comm, x, local_params[comm.rank])
        forward_calls = collective_calls(comm)
        comm.meter.reset()
        dx, grads = impl.parallel_mlp_backward(comm, given_dy, cache)
        check_unchanged({"dy": given_dy}, {"dy": dy}, comm.rank)
        assert_not_aliased([y, dx, *grads.values()], [x, given_dy, *local_params[comm.rank].values()],
                           "MLP outputs", comm.rank)
        return y, dx, grads, forward_calls, collective_calls(comm)

    x_before = x.copy()
    for rank, (y, dx, grads, forward_calls, backward_calls) in enumerate(run_graded(on_rank, t)):
        # at this point every rank must hold the single-device output and input gradient
        assert_matches_reference(y, y_ref, name="y", rank=rank)
        assert_matches_reference(dx, dx_ref, name="dx", rank=rank)
        # and the gradient of its own weight shards
        assert_all_match(grads, expected_grads[rank], rank=rank)
        # GeLU is element-wise, so the column shard feeds the row layer with no communication:
        # one all-reduce forward (g after the row layer), one backward (f before the column layer)
        check_calls(forward_calls, {"all_reduce": 1}, "MLP forward", rank, t)
        check_calls(backward_calls, {"all_reduce": 1}, "MLP backward", rank, t)
        assert_all_match(local_params[rank], before[rank], rank=rank, exact=True)  # inputs untouched
    assert_matches_reference(x, x_before, name="x (must not be modified)", exact=True)
