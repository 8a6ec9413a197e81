"""Every collective, on the simulator for world sizes 1..8, against the single-device result.

Integer-valued data adds exactly in any order, so sums are compared bit for bit; gaussian
data checks the tolerance policy (the ring adds in a different order than numpy.sum).
Lengths are chosen NOT divisible by most world sizes (7 rows, and 3 rows for empty chunks).
"""
import numpy as np
import pytest

from tp_from_scratch import collectives as C
from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.testing import random_array, rank_rng

WORLD_SIZES = range(1, 9)
NUMPY_OP = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}


def inputs(p, shape, seed, dtype=np.float64, integer=True):
    """Rank-distinct inputs, generated up front so the test knows every rank's data."""
    return [random_array(rank_rng(seed, r), shape, dtype, integer=integer) for r in range(p)]


def run_checked(fn, xs):
    """run_spmd where rank r gets xs[r]; proves no input was modified, nor aliased by the result."""
    originals = [x.copy() for x in xs]
    out = run_spmd(lambda comm: fn(comm, xs[comm.rank]), len(xs))
    for r, (x, x0, y) in enumerate(zip(xs, originals, out)):
        assert_matches_reference(x, x0, name="input after the collective", rank=r, exact=True)
        # a result that shares memory with the input would let the caller corrupt one via the other
        assert y is None or not np.shares_memory(x, y), f"rank {r}: the result is a view of the input"
    return out


@pytest.mark.parametrize("p", WORLD_SIZES)
@pytest.mark.parametrize("op", ["sum", "max", "min", "prod"])
def test_all_reduce_integer_data_is_bit_exact(p, op):
    xs = inputs(p, (7, 3), seed=10 + p)
    expected = NUMPY_OP[op](np.stack(xs), axis=0)
    for r, y in enumerate(run_checked(lambda c, x: C.all_reduce(c, x, op=op), xs)):
        assert_matches_reference(y, expected, name=f"all_reduce {op}", rank=r, exact=True)


@pytest.mark.parametrize("p", WORLD_SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_all_reduce_gaussian_within_tolerance_and_identical_on_all_ranks(p, dtype):
    xs = inputs(p, (5, 4, 3), seed=20 + p, dtype=dtype, integer=False)
    out = run_checked(lambda c, x: C.all_reduce(c, x), xs)
    expected = np.sum(np.stack(xs), axis=0, dtype=dtype)
    for r, y in enumerate(out):
        assert_matches_reference(y, expected, name="all_reduce sum", rank=r)
        # the all-gather phase copies: every rank holds the very same bits
        assert_matches_reference(y, out[0], name="all_reduce vs rank 0", rank=r, exact=True)


@pytest.mark.parametrize("p", WORLD_SIZES)
def test_all_reduce_keeps_int_dtype_and_scalar_shape(p):
    xs = [np.array(r + 1, dtype=np.int64) for r in range(p)]  # 0-d arrays
    for r, y in enumerate(run_checked(lambda c, x: C.all_reduce(c, x), xs)):
        assert_matches_reference(y, np.array(p * (p + 1) // 2, dtype=np.int64), name="scalar", rank=r)


@pytest.mark.parametrize("p", WORLD_SIZES)
def test_reduce_and_broadcast_keep_scalar_shape(p):
    xs = [np.array(r + 1.5) for r in range(p)]  # 0-d arrays: they must arrive 0-d, not as (1,)
    for r, y in enumerate(run_checked(lambda c, x: C.reduce(c, x, root=p - 1), xs)):
        if r == p - 1:
            assert_matches_reference(y, np.sum(xs), name="reduce of 0-d arrays", rank=r, exact=True)
    for r, y in enumerate(run_checked(lambda c, x: C.broadcast(c, x if c.rank == 0 else None), xs)):
        assert_matches_reference(y, xs[0], name="broadcast of a 0-d array", rank=r, exact=True)


@pytest.mark.parametrize("p", WORLD_SIZES)
@pytest.mark.parametrize("rows, axis", [(7, 0), (3, 0), (7, 1), (7, -1)])
def test_reduce_scatter_splits_like_array_split(p, rows, axis):
    shape = (rows, 4) if axis == 0 else (4, rows)
    xs = inputs(p, shape, seed=30 + p)
    expected = np.array_split(np.sum(np.stack(xs), axis=0), p, axis=axis)
    for r, y in enumerate(run_checked(lambda c, x: C.reduce_scatter(c, x, axis=axis), xs)):
        assert_matches_reference(y, expected[r], name="reduce_scatter", rank=r, exact=True)


@pytest.mark.parametrize("p", WORLD_SIZES)
@pytest.mark.parametrize("axis", [0, 1])
def test_all_gather_concatenates_unequal_shards_in_rank_order(p, axis):
    # rank r holds r % 3 rows: some shards are empty, none are equal
    xs = [random_array(rank_rng(40, r), (r % 3, 2, 3) if axis == 0 else (2, r % 3 + 1, 3), np.float32)
          for r in range(p)]
    expected = np.concatenate(xs, axis=axis)
    for r, y in enumerate(run_checked(lambda c, x: C.all_gather(c, x, axis=axis), xs)):
        assert_matches_reference(y, expected, name="all_gather", rank=r, exact=True)


@pytest.mark.parametrize("p", WORLD_SIZES)
def test_broadcast_from_every_root(p):
    for root in range(p):
        xs = inputs(p, (3, 5), seed=50 + root, integer=False)
        out = run_checked(lambda c, x: C.broadcast(c, x if c.rank == root else None, root=root), xs)
        for r, y in enumerate(out):
            assert_matches_reference(y, xs[root], name=f"broadcast from {root}", rank=r, exact=True)


@pytest.mark.parametrize("p", WORLD_SIZES)
@pytest.mark.parametrize("op", ["sum", "max"])
def test_reduce_onto_every_root(p, op):
    for root in range(p):
        xs = inputs(p, (4, 3), seed=60 + root, dtype=np.float32)
        out = run_checked(lambda c, x: C.reduce(c, x, root=root, op=op), xs)
        for r, y in enumerate(out):
            if r == root:
                assert_matches_reference(y, NUMPY_OP[op](np.stack(xs), axis=0), name="reduce", rank=r, exact=True)
            else:
                assert y is None, f"reduce returned {y!r} on non-root rank {r}"


@pytest.mark.parametrize("p", WORLD_SIZES)
def test_scatter_and_gather_are_inverse(p):
    root = p // 2
    full = random_array(rank_rng(70), (9, 2))
    xs = [full if r == root else None for r in range(p)]
    shards = run_spmd(lambda c: C.scatter(c, xs[c.rank], root=root), p)
    for r, shard in enumerate(shards):
        assert_matches_reference(shard, np.array_split(full, p)[r], name="scatter", rank=r, exact=True)
    gathered = run_checked(lambda c, x: C.gather(c, x, root=root), shards)
    assert_matches_reference(gathered[root], full, name="gather", rank=root, exact=True)
    assert all(g is None for r, g in enumerate(gathered) if r != root)


@pytest.mark.parametrize("p", WORLD_SIZES)
@pytest.mark.parametrize("split_axis, concat_axis", [(0, 1), (1, 0), (0, 0)])
def test_all_to_all_reshards(p, split_axis, concat_axis):
    xs = inputs(p, (7, 5), seed=80 + p)
    out = run_checked(lambda c, x: C.all_to_all(c, x, split_axis, concat_axis), xs)
    for r, y in enumerate(out):
        # rank r ends with chunk r of every rank's input, glued in rank order
        expected = np.concatenate([np.array_split(x, p, axis=split_axis)[r] for x in xs], axis=concat_axis)
        assert_matches_reference(y, expected, name="all_to_all", rank=r, exact=True)


def test_unknown_op_and_bad_root_are_named():
    with pytest.raises(Exception, match=r"unknown reduction op 'avg'"):
        run_spmd(lambda c: C.all_reduce(c, np.ones(3), op="avg"), 2)
    with pytest.raises(Exception, match=r"root 3 does not exist \(world_size is 2\)"):
        run_spmd(lambda c: C.broadcast(c, np.ones(3), root=3), 2)


# ---- cost model: the meter's figures, exact -------------------------------------------
def chunk_bytes(n_elements, p, itemsize):
    return [len(c) * itemsize for c in np.array_split(np.arange(n_elements), p)]


@pytest.mark.parametrize("p", WORLD_SIZES)
@pytest.mark.parametrize("n", [24, 10])
def test_ring_costs_per_rank(p, n):
    """all_reduce sends 2N - chunk_r - chunk_(r+1); reduce_scatter N - chunk_r;
    all_gather everything but shard (r+1); with p | n that is 2(p-1)/p N and (p-1)/p N."""
    itemsize = 8
    nbytes = n * itemsize

    def fn(comm):
        x = np.ones(n)
        out = {}
        for name, call in [("all_reduce", lambda: C.all_reduce(comm, x)),
                           ("reduce_scatter", lambda: C.reduce_scatter(comm, x)),
                           ("all_gather", lambda: C.all_gather(comm, x[: comm.rank + 1])),
                           ("all_to_all", lambda: C.all_to_all(comm, x, 0, 0))]:
            comm.meter.reset()
            call()
            out[name] = comm.meter.snapshot()
        return out

    chunks = chunk_bytes(n, p, itemsize)
    shard = [(r + 1) * itemsize for r in range(p)]  # rank r gathers r + 1 elements
    for r, m in enumerate(run_spmd(fn, p)):
        nxt = (r + 1) % p
        expect = {
            "all_reduce": (2 * (p - 1), 2 * nbytes - chunks[r] - chunks[nxt]),
            "reduce_scatter": (p - 1, nbytes - chunks[r]),
            "all_gather": (p - 1, sum(shard) - shard[nxt]),
            "all_to_all": (p - 1, nbytes - chunks[r]),
        }
        for name, (messages, sent) in expect.items():
            assert (m[name]["messages_sent"], m[name]["bytes_sent"]) == (messages, sent), (name, r)
            # what goes around the ring comes around: the same volume arrives as leaves
            assert m[name]["by_collective"][name]["bytes_sent"] == sent
        if n % p == 0:
            assert m["all_reduce"]["bytes_sent"] * p == 2 * (p - 1) * nbytes
            assert m["reduce_scatter"]["bytes_sent"] * p == (p - 1) * nbytes


@pytest.mark.parametrize("p", WORLD_SIZES)
def test_tree_costs(p):
    """Binomial broadcast: the root sends ceil(log2 p) messages, every other rank receives one;
    binomial reduce: every rank but the root sends exactly one message."""
    def fn(comm):
        x = np.ones(6)
        C.broadcast(comm, x, root=0)
        b = comm.meter.snapshot()
        comm.meter.reset()
        C.reduce(comm, x, root=0)
        return b, comm.meter.snapshot()

    depth = (p - 1).bit_length()  # ceil(log2 p)
    for r, (b, red) in enumerate(run_spmd(fn, p)):
        assert b["messages_received"] == (0 if r == 0 else 1)
        assert red["messages_sent"] == (0 if r == 0 else 1)
        assert red["bytes_sent"] == (0 if r == 0 else 48)
        if r == 0:
            assert b["messages_sent"] == depth and red["messages_received"] == depth
