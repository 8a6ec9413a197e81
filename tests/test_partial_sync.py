"""Lesson 8, numpy: the partial reduce and the CAAT block stack, exact against a t-stream reference.

The story of these tests:
  * the partial reduce all-reduces exactly the leading k = floor(p*H) channels (bit-exact on
    integer data), scales the rest by sqrt(t), forward and backward, and its meter shows k/H
    of the full all-reduce's bytes;
  * the single-device t-stream reference is right: its backward agrees with finite
    differences, and at p = 1 every stream IS the ordinary single-device block stack;
  * the TP stack equals the reference for every output and gradient, t = 1..4, p in
    {1, 0.5, 0.25, 0}, on the simulator and (one launch) under mpiexec -n 4.
"""
import math

import numpy as np
import pytest

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.comm.launchers import mpiexec_command, run_command
from tp_from_scratch.compare import assert_matches_reference, finite_difference_tolerance
from tp_from_scratch.layers import reference as ref
from tp_from_scratch.partial_sync import check, mappings, reference
from tp_from_scratch.partial_sync.params import init_stack_params
from tp_from_scratch.testing import random_array, rank_rng

TPS = [1, 2, 3, 4]
PS = [1.0, 0.5, 0.25, 0.0]

FD_STEP = 1e-6  # the central differences' step h (float64)


def test_synced_channels_rounds_down_and_ignores_float_noise():
    assert mappings.synced_channels(24, 0.5) == 12
    assert mappings.synced_channels(10, 0.25) == 2       # 2.5 -> 2, as the authors' int(h * p)
    assert mappings.synced_channels(100, 0.29) == 29     # 28.999999999999996 counts as 29
    assert mappings.synced_channels(7, 0.0) == 0 and mappings.synced_channels(7, 1.0) == 7
    with pytest.raises(ValueError, match="sync fraction p must be in"):
        mappings.synced_channels(8, 1.5)


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("t", TPS)
def test_partial_reduce_sums_the_slice_and_scales_the_rest(t, p):
    shape, H = (2, 3, 8), 8
    k = mappings.synced_channels(H, p)
    everyone = [random_array(rank_rng(5, r), shape, integer=True) for r in range(t)]
    total = sum(everyone[1:], everyone[0].copy())

    def on_rank(comm):
        mine = everyone[comm.rank]
        kept = mine.copy()
        before = comm.meter.bytes_sent
        for direction in (mappings.partial_reduce_forward, mappings.partial_reduce_backward):
            out = direction(comm, mine, p)
            # integer data: the ring's sums are exact, so the synced slice is bit-exact
            assert_matches_reference(out[..., :k], total[..., :k], name="synced channels",
                                     rank=comm.rank, exact=True)
            assert_matches_reference(out[..., k:], mine[..., k:] * math.sqrt(t),
                                     name="private channels", rank=comm.rank, exact=True)
            assert out is not mine and not np.shares_memory(out, mine)
        assert np.array_equal(mine, kept), "the partial reduce modified its input"
        return comm.meter.bytes_sent - before

    sent = run_spmd(on_rank, t)
    # summed over the ring, an all-reduce of N elements sends 2(t-1)N: the slice is k/H of it
    full = 2 * 2 * (t - 1) * np.prod(shape) * 8
    assert sum(sent) * H == full * k
    assert sent == [2 * mappings.partial_reduce_bytes(shape, p, t, 8, r) for r in range(t)]


def test_replicated_gradients_are_summed_once_and_the_rest_untouched():
    def on_rank(comm):
        grads = {"ln1.weight": np.full(3, comm.rank + 1.0), "mlp.fc.weight": np.full((2, 2), comm.rank + 1.0)}
        out = mappings.sum_replicated_grads(comm, grads, ["ln1.weight", "absent"])
        assert np.array_equal(out["ln1.weight"], np.full(3, 6.0))       # 1 + 2 + 3
        assert out["mlp.fc.weight"] is grads["mlp.fc.weight"]
        assert np.array_equal(grads["ln1.weight"], np.full(3, comm.rank + 1.0))

    run_spmd(on_rank, 3)


def _stack_loss(x, params, config, t, p, dys):
    ys, _ = reference.streams_stack_forward(x, params, config, t, p)
    return float(np.sum(ys * dys))


@pytest.mark.parametrize("t, p", [(3, 0.5), (2, 0.0)])
def test_reference_backward_matches_finite_differences(t, p):
    # an independent check of the reference's hand-written backward: central differences
    # (h = 1e-6, float64) are accurate to ~1e-9; a wrong backward is off by O(1)
    rng = rank_rng(7)
    config = check.check_config(t)
    params = init_stack_params(rng, config, 2)
    x = random_array(rng, (2, 3, config.hidden))
    dys = random_array(rng, (t, 2, 3, config.hidden))
    _, cache = reference.streams_stack_forward(x, params, config, t, p)
    dx, grads = reference.streams_stack_backward(dys, cache)
    for name, value, grad in [("x", x, dx), ("ln1.weight", params[0]["ln1.weight"], grads[0]["ln1.weight"]),
                              ("attn.o.bias", params[1]["attn.o.bias"], grads[1]["attn.o.bias"]),
                              ("attn.q.weight", params[0]["attn.q.weight"], grads[0]["attn.q.weight"]),
                              ("mlp.proj.weight", params[0]["mlp.proj.weight"], grads[0]["mlp.proj.weight"])]:
        flat = value.reshape(-1)
        coords = rng.choice(flat.size, size=4, replace=False)
        numeric = []
        for c in coords:
            saved = flat[c]
            flat[c] = saved + FD_STEP
            up = _stack_loss(x, params, config, t, p, dys)
            flat[c] = saved - FD_STEP
            down = _stack_loss(x, params, config, t, p, dys)
            flat[c] = saved
            numeric.append((up - down) / (2 * FD_STEP))
        assert_matches_reference(grad.reshape(-1)[coords], np.array(numeric),
                                 name=f"finite-difference grad of {name}",
                                 tol=finite_difference_tolerance(FD_STEP, "float64"))


@pytest.mark.parametrize("t", TPS)
def test_reference_at_p_1_is_the_ordinary_block_stack(t):
    # at p = 1 nothing is private: every stream is the single-device model, and the streams'
    # gradients (Partial, as a vocabulary-parallel head hands them back) add up to its dy
    rng = rank_rng(11)
    config = check.check_config(t)
    params = init_stack_params(rng, config, 2)
    x = random_array(rng, (2, 3, config.hidden))
    dys = random_array(rng, (t, 2, 3, config.hidden))
    ys, cache = reference.streams_stack_forward(x, params, config, t, 1.0)
    dx, grads = reference.streams_stack_backward(dys, cache)

    y, caches = x, []
    for prm in params:
        y, c = ref.block_forward(y, prm, config)
        caches.append(c)
    dy, grads_ordinary = dys.sum(axis=0), []
    for c in reversed(caches):
        dy, g = ref.block_backward(dy, c)
        grads_ordinary.insert(0, g)
    for s in range(t):
        assert_matches_reference(ys[s], y, name=f"stream {s}")
    assert_matches_reference(dx, dy, name="grad of x")
    for i, (g, g_ordinary) in enumerate(zip(grads, grads_ordinary)):
        assert set(g) == set(g_ordinary)
        for key in g_ordinary:
            assert_matches_reference(g[key], g_ordinary[key], name=f"grad of block {i} {key}")


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("t", TPS)
def test_tp_stack_matches_the_t_stream_reference(t, p):
    # outputs per stream, dx, every gradient (gathered), and the forward's bytes, on every rank
    run_spmd(check.check_stack, t, check.check_config(t), p, seed=t)


def test_streams_really_diverge_below_p_1():
    # a test that could not fail otherwise: with private channels the ranks' streams differ
    t, config = 2, check.check_config(2)
    rng = rank_rng(3)
    params = init_stack_params(rng, config, 1)
    x = random_array(rng, (1, 3, config.hidden))
    ys, _ = reference.streams_stack_forward(x, params, config, t, 0.5)
    k = mappings.synced_channels(config.hidden, 0.5)
    assert not np.allclose(ys[0][..., k:], ys[1][..., k:])


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_tp_stack_matches_the_reference_under_mpiexec():
    result = run_command(mpiexec_command(4, "tp_from_scratch.partial_sync.check"), timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    for rank in range(4):
        assert f"rank {rank} of 4: all " in result.stdout, result.stdout[-3000:]
    assert "(MPIComm)" in result.stdout
