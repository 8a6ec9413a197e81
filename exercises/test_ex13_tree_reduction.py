"""Graders for Exercise 13: the fixed binary-tree all-reduce and the invariant row-parallel matmul.

Every comparison is BIT FOR BIT (assert_matches_reference(..., exact=True)) on gaussian data,
whose sums show any change of order in their last bits. The expected values are written out
here, independently of the library: the tree level by level, each leaf's product one numpy
matmul. Each test runs the implementation on t simulated ranks (run_graded), rank r given the
leaves (or columns) r L/t .. (r+1) L/t - 1.
"""
import re

import numpy as np
import pytest

from tp_from_scratch.comm import SPMDError
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.testing import random_array, rank_rng
from tp_from_scratch.tools.grading import run_graded

TS = (1, 2, 4, 8)
TIMEOUT = 10.0


def pairwise(leaves):
    """The fixed tree over ``leaves`` (n, ...), written out: neighbours first, the left one first."""
    level = list(leaves)
    while len(level) > 1:
        level = [level[i] + level[i + 1] for i in range(0, len(level), 2)]
    return level[0]


def draw(seed, n, shape, dtype=np.float32):
    return np.stack([random_array(rank_rng(seed, j), shape, dtype) for j in range(n)]) if n else None


def spmd(fn, t):
    __tracebackhide__ = True
    return run_graded(fn, t, timeout=TIMEOUT)


def tree_on(impl, leaves, t, n_leaves=8):
    """(every rank's result, the copies each rank was given)."""
    here = n_leaves // t
    given = [leaves[r * here:(r + 1) * here].copy() for r in range(t)]
    return spmd(lambda comm: impl.tree_all_reduce(comm, given[comm.rank], n_leaves), t), given


def check_all(results, want, what):
    __tracebackhide__ = True
    for rank, got in enumerate(results):
        assert_matches_reference(got, want, name=what, rank=rank, exact=True)


# ---------------------------------------------------------------- tree_all_reduce: the bits

@pytest.mark.parametrize("t", TS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16], ids=["float32", "float64", "float16"])
def test_tree_all_reduce_is_the_fixed_tree_bit_for_bit_on_every_rank(impl, t, dtype):
    leaves = draw(1300, 8, (97,), dtype)
    results, _ = tree_on(impl, leaves, t)
    check_all(results, pairwise(leaves), f"tree_all_reduce t={t} {np.dtype(dtype).name} (expected: the tree "
                                         f"((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), bit for bit)")


@pytest.mark.parametrize("n_leaves,t", [(1, 1), (2, 2), (4, 2), (16, 4), (16, 16)])
def test_other_trees(impl, n_leaves, t):
    leaves = draw(1301, n_leaves, (5, 3))
    results, _ = tree_on(impl, leaves, t, n_leaves)
    check_all(results, pairwise(leaves), f"tree of {n_leaves} leaves at t={t}")


@pytest.mark.parametrize("t", [1, 4])
@pytest.mark.parametrize("shape", [(), (0,), (3, 0)], ids=["0-d", "empty", "3x0"])
def test_0d_and_empty_leaves(impl, t, shape):
    leaves = draw(1302, 8, shape, np.float64)
    results, _ = tree_on(impl, leaves, t)
    check_all(results, pairwise(leaves), f"tree of {shape} leaves at t={t}")


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integers_keep_their_dtype(impl, dtype):
    leaves = (draw(1303, 8, (6,), np.float64) * 1000).astype(dtype)
    results, _ = tree_on(impl, leaves, 4)
    check_all(results, leaves.sum(0, dtype=dtype), f"integer tree ({np.dtype(dtype).name})")


def test_extreme_values_follow_the_tree(impl):
    # float32's largest values: (big + big) overflows to inf in the tree, (-big - big) to -inf, and
    # inf - inf is nan. A sequential sum gets inf, and a ring something else again
    big = np.finfo(np.float32).max
    leaves = np.array([[big, 1.0], [big, 2.0], [-big, 2.0 ** -140], [-big, 3.0],
                       [big, np.inf], [-big, 5.0], [big, 6.0], [big, -np.inf]], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        want = pairwise(leaves)
        for t in TS:
            results, _ = tree_on(impl, leaves, t)
            check_all(results, want, f"extreme values at t={t} (big + big = inf, inf - inf = nan, in the tree's order)")
    tiny = draw(1304, 8, (40,), np.float64) * 2.0 ** -1060   # subnormal float64: rounding at every add
    check_all(tree_on(impl, tiny, 8)[0], pairwise(tiny), "subnormal leaves at t=8")


# ---------------------------------------------------------------- inputs, outputs, errors

@pytest.mark.parametrize("n_leaves,t", [(1, 1), (8, 1), (8, 8)])
def test_tree_all_reduce_leaves_its_input_and_returns_a_new_array(impl, n_leaves, t):
    leaves = draw(1305, n_leaves, (9,))
    results, given = tree_on(impl, leaves, t, n_leaves)
    here = n_leaves // t
    for rank, got in enumerate(results):
        assert_matches_reference(given[rank], leaves[rank * here:(rank + 1) * here], name="leaves (must not change)",
                                 rank=rank, exact=True)
        assert not np.shares_memory(got, given[rank]), (
            f"rank {rank} of {t}: the result shares memory with the leaves (a view of one of them); return a new "
            f"array, also at t = 1 with one leaf")


@pytest.mark.parametrize("t", [1, 4])
def test_each_call_returns_a_fresh_array_that_a_later_call_leaves_alone(impl, t):
    # a result is the caller's: a second call (another layer's sum) must not write into the first
    # call's result, as a reused workspace would; for both functions
    first, second = draw(1313, 8, (6,)), draw(1314, 8, (6,))
    x = [random_array(rank_rng(1315, j), (3, 16), np.float32) for j in range(2)]
    w = [random_array(rank_rng(1316, j), (16, 6), np.float32) for j in range(2)]
    here = 8 // t
    cols = np.array_split(np.arange(16), t)

    def body(comm):
        mine = slice(comm.rank * here, (comm.rank + 1) * here)
        a = impl.tree_all_reduce(comm, first[mine].copy())
        kept = np.array(a, copy=True)
        b = impl.tree_all_reduce(comm, second[mine].copy())
        c = impl.invariant_row_parallel_matmul(comm, x[0][:, cols[comm.rank]].copy(), w[0][cols[comm.rank]].copy())
        kept_c = np.array(c, copy=True)
        impl.invariant_row_parallel_matmul(comm, x[1][:, cols[comm.rank]].copy(), w[1][cols[comm.rank]].copy())
        return a, kept, b, c, kept_c
    for rank, (a, kept, b, c, kept_c) in enumerate(spmd(body, t)):
        assert_matches_reference(a, kept, name=(f"tree_all_reduce's first result after a second call (rank {rank} of "
                                                f"{t}): return a new array from every call, not a reused buffer"),
                                 rank=rank, exact=True)
        assert not np.shares_memory(a, b), f"rank {rank} of {t}: two calls of tree_all_reduce returned one buffer"
        assert_matches_reference(c, kept_c, name=(f"invariant_row_parallel_matmul's first result after a second call "
                                                  f"(rank {rank} of {t}): return a new array from every call"),
                                 rank=rank, exact=True)


def refused(impl, t, leaves, n_leaves, pattern, what):
    __tracebackhide__ = True
    with pytest.raises((SPMDError, ValueError)) as caught:
        spmd(lambda comm: impl.tree_all_reduce(comm, leaves.copy(), n_leaves), t)
    error = getattr(caught.value, "error", caught.value)
    assert isinstance(error, ValueError), f"{what}: expected a ValueError, got {type(error).__name__}: {error}"
    assert re.search(pattern, str(error)), f"{what}: the message {str(error)!r} should name it ({pattern})"


@pytest.mark.parametrize("t", [3, 5, 6, 7])
def test_a_t_that_does_not_divide_the_leaves_is_refused_by_name(impl, t):
    refused(impl, t, draw(1306, 8 // t, (4,)), 8, rf"tp={t}\b", f"t={t} with 8 leaves")


def test_a_leaf_count_that_is_not_a_power_of_two_is_refused_by_name(impl):
    refused(impl, 2, draw(1307, 3, (4,)), 6, r"n_leaves", "n_leaves=6")


@pytest.mark.parametrize("count", [1, 3])
def test_a_rank_holding_the_wrong_number_of_leaves_is_refused(impl, count):
    refused(impl, 2, draw(1308, count, (4,)), 8, r"leaves", f"{count} leaves on each of 2 ranks for a tree of 8")


# ---------------------------------------------------------------- the messages

class RecordingComm:
    """The rank's communicator, passed through, noting every peer it sends to or receives from."""

    def __init__(self, comm):
        self._comm = comm
        self.peers = set()

    def send(self, array, dst, *args, **kwargs):
        self.peers.add(dst)
        return self._comm.send(array, dst, *args, **kwargs)

    def recv(self, src, *args, **kwargs):
        self.peers.add(src)
        return self._comm.recv(src, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._comm, name)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_log2_t_messages_of_one_leaf_to_the_recursive_doubling_partners(impl, t):
    leaves = draw(1309, 8, (50,))
    here = 8 // t

    def body(comm):
        recording = RecordingComm(comm)
        comm.meter.reset()
        impl.tree_all_reduce(recording, leaves[comm.rank * here:(comm.rank + 1) * here].copy())
        return recording.peers, comm.meter.messages_sent, comm.meter.bytes_sent
    rounds = t.bit_length() - 1
    for rank, (peers, messages, nbytes) in enumerate(spmd(body, t)):
        partners = {rank ^ (1 << k) for k in range(rounds)}
        assert peers == partners, f"rank {rank} of {t} talked to {sorted(peers)}; recursive doubling talks to {sorted(partners)}"
        assert (messages, nbytes) == (rounds, rounds * 200), (
            f"rank {rank} of {t}: sent {messages} messages, {nbytes} bytes; the tree's upper levels send "
            f"{rounds} messages of one leaf's 200 bytes")


# ---------------------------------------------------------------- invariant_row_parallel_matmul

def leaf_products(x, w, count):
    """Each leaf's partial x[:, leaf] @ w[leaf, :], written out here: (count, M, N)."""
    width = x.shape[1] // count
    return np.stack([x[:, j * width:(j + 1) * width] @ w[j * width:(j + 1) * width] for j in range(count)])


def matmul_on(impl, x, w, t, n_leaves=8):
    cols = np.array_split(np.arange(x.shape[1]), t)
    given = [(x[:, c].copy(), w[c].copy()) for c in cols]
    results = spmd(lambda comm: impl.invariant_row_parallel_matmul(comm, *given[comm.rank], n_leaves), t)
    return results, given


@pytest.mark.parametrize("t", TS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_the_row_parallel_matmul_has_the_bits_of_t1_at_every_t(impl, t, dtype):
    x, w = random_array(rank_rng(1310, 0), (24, 128), dtype), random_array(rank_rng(1310, 1), (128, 40), dtype)
    want = pairwise(leaf_products(x, w, 8))
    results, _ = matmul_on(impl, x, w, t)
    check_all(results, want, f"invariant_row_parallel_matmul t={t} (expected: one matmul per leaf of 16 columns, "
                             f"then the tree)")
    assert_matches_reference(results[0], x @ w, name="the invariant product against X @ W (tolerance)")


@pytest.mark.parametrize("shape", [(0, 64, 8), (5, 64, 0), (3, 8, 2)], ids=["no-rows", "no-columns", "one-column-leaves"])
def test_empty_and_narrow_matmuls(impl, shape):
    m, k, n = shape
    x, w = random_array(rank_rng(1311, 0), (m, k), np.float64), random_array(rank_rng(1311, 1), (k, n), np.float64)
    for t in (1, 8):
        results, _ = matmul_on(impl, x, w, t)
        check_all(results, pairwise(leaf_products(x, w, 8)), f"matmul {shape} at t={t}")


@pytest.mark.parametrize("t", [1, 4])
def test_the_matmul_leaves_its_inputs_and_returns_a_new_array(impl, t):
    x, w = random_array(rank_rng(1312, 0), (6, 32), np.float32), random_array(rank_rng(1312, 1), (32, 5), np.float32)
    results, given = matmul_on(impl, x, w, t)
    cols = np.array_split(np.arange(32), t)
    for rank, got in enumerate(results):
        assert_matches_reference(given[rank][0], x[:, cols[rank]], name="x_shard (must not change)", rank=rank, exact=True)
        assert_matches_reference(given[rank][1], w[cols[rank]], name="w_shard (must not change)", rank=rank, exact=True)
        assert not any(np.shares_memory(got, a) for a in given[rank]), f"rank {rank}: the result is a view of an input"


@pytest.mark.parametrize("case", ["t=3", "K/t=6 into 4 leaves", "shapes"])
def test_the_matmul_refuses_what_the_tree_cannot_serve(impl, case):
    t, x, w, pattern = {
        "t=3": (3, np.ones((2, 24)), np.ones((24, 2)), r"tp=3\b"),
        "K/t=6 into 4 leaves": (2, np.ones((2, 12)), np.ones((12, 2)), r"."),
        "shapes": (2, np.ones((2, 16)), np.ones((12, 2)), r"."),
    }[case]
    cols = np.array_split(np.arange(x.shape[1]), t)
    rows = np.array_split(np.arange(w.shape[0]), t)
    with pytest.raises((SPMDError, ValueError)) as caught:
        spmd(lambda comm: impl.invariant_row_parallel_matmul(comm, x[:, cols[comm.rank]], w[rows[comm.rank]]), t)
    error = getattr(caught.value, "error", caught.value)
    assert isinstance(error, ValueError), f"{case}: expected a ValueError, got {type(error).__name__}: {error}"
    assert re.search(pattern, str(error)), f"{case}: the message {str(error)!r} should name it ({pattern})"
