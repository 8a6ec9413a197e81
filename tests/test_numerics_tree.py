"""Lesson 13's fixed binary-tree reduction on simulated ranks: the same bits at t = 1, 2, 4, 8.

The leaves are gaussian float32 (random_array(..., integer=False)): sums whose order shows in the
last bits, so a result equal bit for bit at every t says the order did not change. The ring and
a sequential sum inside a rank, given the same leaves, must come out in other bits (they fail);
t values the tree cannot serve are refused by name; the meter shows log2 t messages per rank.
"""
import numpy as np
import pytest
import torch

from tp_from_scratch.comm import SPMDError, run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.numerics import measure, reduction, tree
from tp_from_scratch.testing import random_array, rank_rng

TS = (1, 2, 4, 8)


def leaves_of(seed, shape=(257,), dtype=np.float32, n=8):
    return np.stack([random_array(rank_rng(seed, j), shape, dtype) for j in range(n)])


def run(reduce, leaves, t, n_leaves=8):
    """Every rank's result of ``reduce`` on t ranks, rank r given leaves r L/t .. (r+1) L/t - 1."""
    here = n_leaves // t
    given = [leaves[r * here:(r + 1) * here].copy() for r in range(t)]
    return run_spmd(lambda comm: reduce(comm, given[comm.rank], n_leaves), t), given


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape", [(257,), (3, 5), (), (0,)], ids=["257", "3x5", "0-d", "empty"])
def test_every_t_gives_the_bits_of_t1_on_every_rank(dtype, shape):
    leaves = leaves_of(1, shape, dtype)
    want = tree.local_tree_sum(leaves)
    for t in TS:
        results, given = run(tree.tree_all_reduce, leaves, t)
        for rank, got in enumerate(results):
            assert_matches_reference(got, want, name=f"tree_all_reduce t={t}", rank=rank, exact=True)
            assert not np.shares_memory(got, given[rank]), f"rank {rank}: the result is a view of the leaves"
            assert_matches_reference(given[rank], leaves[rank * 8 // t:(rank + 1) * 8 // t], name="leaves",
                                     rank=rank, exact=True)  # untouched


def test_the_tree_is_the_pairwise_order_not_any_other():
    # ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), written out; and it differs from a sequential sum
    leaves = leaves_of(2)
    l0, l1, l2, l3, l4, l5, l6, l7 = leaves
    written = ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))
    assert_matches_reference(tree.local_tree_sum(leaves), written, name="tree order", exact=True)
    sequential = l0
    for leaf in leaves[1:]:
        sequential = sequential + leaf
    assert not np.array_equal(written, sequential), "the data must be able to tell the orders apart"


@pytest.mark.parametrize("t", [2, 4, 8])
def test_the_meter_counts_log2_t_messages_of_one_leaf(t):
    leaves = leaves_of(3, (100,))

    def body(comm):
        here = 8 // t
        comm.meter.reset()
        tree.tree_all_reduce(comm, leaves[comm.rank * here:(comm.rank + 1) * here])
        traffic = comm.meter.by_collective["tree_all_reduce"]
        return (traffic.calls, traffic.messages_sent, traffic.bytes_sent, traffic.messages_received,
                comm.meter.messages_sent)
    rounds = t.bit_length() - 1
    for rank, got in enumerate(run_spmd(body, t)):
        assert got == (1, rounds, rounds * 400, rounds, rounds), f"rank {rank}: {got}"
        assert tree.tree_traffic(t, 400) == (rounds, rounds * 400)


@pytest.mark.parametrize("t", [3, 5, 6])
def test_a_t_the_leaves_cannot_serve_is_refused_by_name(t):
    with pytest.raises(SPMDError, match=f"tp={t} cannot serve the fixed reduction tree of 8 leaves"):
        run_spmd(lambda comm: tree.tree_all_reduce(comm, np.ones((1, 4), np.float32)), t)
    with pytest.raises(ValueError, match="t = 1, 2, 4, 8"):
        tree.check_leaves(8, t)


def test_bad_leaf_counts_are_refused_by_name():
    with pytest.raises(ValueError, match="power of two of leaves, got n_leaves=6"):
        tree.check_leaves(6, 2)
    with pytest.raises(SPMDError, match="gives each rank 4 leaves along axis 0, got 3 leaves"):
        run_spmd(lambda comm: tree.tree_all_reduce(comm, np.ones((3, 2))), 2)
    with pytest.raises(ValueError, match="power of two of leaves, got 3"):
        tree.local_tree_sum(np.ones((3, 2)))


@pytest.mark.parametrize("t", [4, 8])
def test_a_ring_in_place_of_the_tree_breaks_the_bits(t):
    leaves = leaves_of(4, (4096,))
    results, _ = run(measure.ring_reduce, leaves, t)
    assert not np.array_equal(results[0], tree.local_tree_sum(leaves))


@pytest.mark.parametrize("t", [1, 2])
def test_a_sequential_sum_inside_a_rank_breaks_the_bits(t):
    leaves = leaves_of(5, (4096,))
    results, _ = run(measure.sequential_reduce, leaves, t)
    assert not np.array_equal(results[0], tree.local_tree_sum(leaves))


def test_the_variants_table_shows_exactly_where_each_order_differs():
    table = measure.breaking_variants()
    assert table["fixed tree"] == {1: True, 2: True, 4: True, 8: True}
    # two partial sums add the same either way round; four or eight do not
    assert table["ring instead"] == {1: True, 2: True, 4: False, 8: False}
    # one or two leaves per rank leave nothing to reorder
    assert table["sequential in a rank"] == {1: False, 2: False, 4: True, 8: True}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_the_torch_tree_on_a_comm_equals_the_numpy_tree(dtype):
    leaves = torch.from_numpy(leaves_of(6, (65,), np.float64)).to(dtype)
    want = tree.local_tree_sum(leaves.to(reduction.accumulation_dtype(dtype))).to(dtype)
    for t in TS:
        here = 8 // t
        got = run_spmd(lambda comm: reduction.tree_all_reduce(comm, leaves[comm.rank * here:(comm.rank + 1) * here]), t)
        for rank, y in enumerate(got):
            assert y.dtype == dtype
            assert_matches_reference(y, want, name=f"torch tree t={t}", rank=rank, exact=True)


def test_the_invariant_row_parallel_matmul_is_t_invariant_and_the_plain_one_is_not():
    table = measure.row_parallel_bits(ts=(1, 2, 4, 8), rows=16, k=256, n=64)
    assert all(row["tree equal"] for row in table.values()), table
    assert not table[8]["plain equal"], "the plain row-parallel matmul must show its t-dependence here"
    # the tree's order is not one device's either: within roundoff of it, not equal to it
    assert 0 < table[8]["tree diff"] < 1e-3, table


def test_the_ring_adds_each_chunk_starting_at_the_next_rank():
    # Lesson 2's ring: chunk c's partial starts at rank c + 1 and travels around
    assert measure.ring_chunk_orders(4) == [1, 2, 3, 0]
