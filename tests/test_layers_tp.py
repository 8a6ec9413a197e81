"""Tensor-parallel layers == single-device reference, on the simulator, for t in 1, 2, 3, 4.

Each case runs one of tp_from_scratch.layers.check's functions on every simulated rank: it
compares the output and dx on every rank, and every parameter gradient (gathered from all
ranks), with compare.assert_matches_reference, and counts the all-reduces each way.
The same functions run under mpiexec in test_layers_mpi.py.
"""
import numpy as np
import pytest

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.layers import check, mappings
from tp_from_scratch.layers.reference import BlockConfig
from tp_from_scratch.testing import random_array, rank_rng

DTYPES = [np.float64, np.float32]
TPS = [1, 2, 3, 4]


@pytest.mark.parametrize("t", TPS)
def test_f_and_g_are_conjugate(t):
    # rank-distinct integer data: every sum is exact, so the all-reduces must be bit-exact
    def on_rank(comm):
        mine = random_array(rank_rng(1, comm.rank), (3, 4), integer=True)
        everyone = [random_array(rank_rng(1, r), (3, 4), integer=True) for r in range(t)]
        total = sum(everyone[1:], everyone[0].copy())
        calls = lambda: check.all_reduce_calls(comm)  # noqa: E731
        # f: identity forward (no communication), all-reduce backward
        assert mappings.f_forward(comm, mine) is mine and calls() == 0
        assert_matches_reference(mappings.f_backward(comm, mine), total, name="f backward",
                                 rank=comm.rank, exact=True)
        # g: all-reduce forward, identity backward (no communication)
        assert_matches_reference(mappings.g_forward(comm, mine), total, name="g forward",
                                 rank=comm.rank, exact=True)
        assert mappings.g_backward(comm, mine) is mine and calls() == 2

    run_spmd(on_rank, t)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", TPS)
def test_column_then_row_linear_matches_reference(t, dtype):
    run_spmd(check.check_linear_pair, t, ffn=12, seed=t, dtype=dtype)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("t", TPS)
def test_column_then_row_linear_is_bit_exact_on_integer_data(t, bias):
    # integers add exactly in any order: a parallel sum must reproduce the reference bit for bit
    run_spmd(check.check_linear_pair, t, ffn=12, seed=10 + t, integer=True, bias=bias)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", TPS)
def test_mlp_matches_reference(t, dtype):
    run_spmd(check.check_mlp, t, hidden=6, ffn=12, seed=20 + t, dtype=dtype)


# (t, query heads, KV heads): plain multi-head, GQA with sharded KV heads, GQA with KV heads
# replicated on t/nkv ranks each, and multi-query (one KV head on every rank)
ATTENTION_CASES = [
    (1, 4, 2), (2, 4, 4), (2, 4, 2), (2, 4, 1), (3, 6, 3), (3, 6, 1), (3, 12, 6),
    (4, 4, 4), (4, 8, 4), (4, 4, 2), (4, 8, 1),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,n_heads,n_kv_heads", ATTENTION_CASES)
def test_attention_matches_reference(t, n_heads, n_kv_heads, dtype):
    run_spmd(check.check_attention, t, hidden=2 * n_heads, n_heads=n_heads,
             n_kv_heads=n_kv_heads, seed=30 + t, dtype=dtype)


BLOCK_CASES = [(1, 4, 4), (2, 4, 2), (2, 4, 1), (3, 6, 3), (4, 4, 4), (4, 8, 2)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,n_heads,n_kv_heads", BLOCK_CASES)
def test_block_matches_reference(t, n_heads, n_kv_heads, dtype):
    config = BlockConfig(hidden=2 * n_heads, n_heads=n_heads, n_kv_heads=n_kv_heads, ffn=12)
    run_spmd(check.check_block, t, config, seed=40 + t, dtype=dtype)


def test_check_everything_compares_every_tensor():
    # the entry point the mpiexec job runs, here on 2 simulated ranks
    counts = run_spmd(check.check_everything, 2)
    assert counts[0] == counts[1] > 100

