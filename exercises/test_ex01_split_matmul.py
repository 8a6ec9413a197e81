"""Graders for Exercise 1: splitting a matmul by columns and by rows.

Each test builds fresh random data, computes the single-device answer with plain numpy
(x @ w, np.split, np.concatenate) and compares through the course's one comparison helper.
Every test also checks that the inputs are unchanged afterwards and that every result is a
new array (no view of an input, not an input returned as is when t = 1): a device must be
able to write into its shard without touching anyone else's data.
"""
import numpy as np
import pytest

from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.testing import random_array, rank_rng
from tp_from_scratch.tools.grading import assert_not_aliased

WORLD_SIZES = [1, 2, 3, 4]  # 3: an odd degree, where power-of-two shortcuts break


def assert_unchanged(arrays, copies, name):
    for i, (a, b) in enumerate(zip(arrays, copies)):
        assert_matches_reference(a, b, name=f"{name} #{i} (must not be modified)", exact=True)


def blocks(array, t, axis):
    """The expected shards, straight from numpy (the grader's own reference)."""
    return np.split(array, t, axis=axis)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("t", WORLD_SIZES)
def test_shard_gives_contiguous_blocks_in_rank_order(impl, t, axis):
    a = random_array(rank_rng(1, t), (12, 24))
    before = a.copy()
    got = impl.shard(a, t, axis)
    assert len(got) == t, f"expected {t} shards, got {len(got)}"
    for rank, (g, e) in enumerate(zip(got, blocks(a, t, axis))):
        assert_matches_reference(g, e, name="shard", rank=rank, exact=True)
        assert_not_aliased(g, [a], "shard", rank)  # a device owns its shard: a copy, not a view
    assert_unchanged([a], [before], "array")


@pytest.mark.parametrize("shape,t,axis,size", [((6, 10), 4, 1, 10), ((9, 8), 2, 0, 9)])
def test_shard_rejects_a_size_the_world_size_does_not_divide(impl, shape, t, axis, size):
    with pytest.raises(ValueError) as error:
        impl.shard(np.zeros(shape), t, axis)
    message = str(error.value)
    # the message must name the dimension, its size and the world size so the learner can act on it
    for part in (str(axis), str(size), str(t)):
        assert part in message, f"unhelpful message (does not say {part!r}): {message!r}"


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("t", WORLD_SIZES)
def test_unshard_concatenates_in_rank_order(impl, t, axis):
    rng = rank_rng(2, t)
    pieces = [random_array(rng, (4, 3) if axis == 1 else (3, 4)) for _ in range(t)]
    before = [p.copy() for p in pieces]
    got = impl.unshard(pieces, axis)
    assert_matches_reference(got, np.concatenate(before, axis=axis), name="unshard", exact=True)
    assert_not_aliased(got, pieces, "unshard")  # also when t = 1: a new array
    assert_unchanged(pieces, before, "shard")


@pytest.mark.parametrize("t", WORLD_SIZES)
def test_column_parallel_blocks_are_column_blocks_of_y(impl, t):
    rng = rank_rng(3, t)
    x, w = random_array(rng, (5, 24)), random_array(rng, (24, 12))
    w_shards = [b.copy() for b in blocks(w, t, axis=1)]
    x_before, w_before = x.copy(), [b.copy() for b in w_shards]
    got = impl.column_parallel_matmul(x, w_shards)
    assert len(got) == t
    assert_unchanged([x, *w_shards], [x_before, *w_before], "input")
    for rank, (y_i, expected) in enumerate(zip(got, blocks(x @ w, t, axis=1))):
        # each block is an ordinary matmul; only BLAS kernel choice may change the rounding
        assert_matches_reference(y_i, expected, name="Y_i", rank=rank)


@pytest.mark.parametrize("t", WORLD_SIZES)
def test_row_parallel_partials_sum_to_y(impl, t):
    rng = rank_rng(4, t)
    x, w = random_array(rng, (5, 24)), random_array(rng, (24, 6))
    x_shards, w_shards = [b.copy() for b in blocks(x, t, 1)], [b.copy() for b in blocks(w, t, 0)]
    before = [a.copy() for a in x_shards + w_shards]
    partials = impl.row_parallel_matmul(x_shards, w_shards)
    assert len(partials) == t
    assert_unchanged(x_shards + w_shards, before, "input")
    for rank, (p, x_i, w_i) in enumerate(zip(partials, blocks(x, t, 1), blocks(w, t, 0))):
        assert_matches_reference(p, x_i @ w_i, name="partial sum", rank=rank)
    assert_matches_reference(sum(partials), x @ w, name="sum of partials")


@pytest.mark.parametrize("t", WORLD_SIZES)
def test_sum_partials_adds_every_partial_and_keeps_inputs(impl, t):
    rng = rank_rng(5, t)
    partials = [random_array(rng, (3, 4), integer=True) for _ in range(t)]
    before = [p.copy() for p in partials]
    # integer-valued data: the sum is exact in any order, so compare bit for bit
    total = impl.sum_partials(partials)
    assert_matches_reference(total, np.sum(before, axis=0), name="sum", exact=True)
    assert_not_aliased(total, partials, "sum_partials")  # t = 1 too: the sum is a new array
    for rank, (p, b) in enumerate(zip(partials, before)):
        assert_matches_reference(p, b, name="input partial (must not be modified)", rank=rank, exact=True)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("t", WORLD_SIZES)
def test_end_to_end_both_splits_equal_single_device(impl, t, dtype):
    rng = rank_rng(6, t)
    x, w = random_array(rng, (7, 36), dtype), random_array(rng, (36, 12), dtype)
    expected = x @ w
    y_col = impl.unshard(impl.column_parallel_matmul(x, impl.shard(w, t, 1)), 1)
    y_row = impl.sum_partials(impl.row_parallel_matmul(impl.shard(x, t, 1), impl.shard(w, t, 0)))
    assert_matches_reference(y_col, expected, name="column-parallel Y")
    assert_matches_reference(y_row, expected, name="row-parallel Y")
    # on integer-valued data every order of summation is exact: demand every bit
    xi, wi = random_array(rng, (7, 36), dtype, True), random_array(rng, (36, 12), dtype, True)
    y_row_int = impl.sum_partials(impl.row_parallel_matmul(impl.shard(xi, t, 1), impl.shard(wi, t, 0)))
    assert_matches_reference(y_row_int, xi @ wi, name="row-parallel Y (integer data)", exact=True)
