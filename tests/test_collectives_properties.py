"""Property tests: for ANY world size, shape (empty included), axis, op and dtype, each
collective equals its single-device definition, keeps dtype and shape, and leaves the input alone.

Integer-valued data, so every comparison is bit-exact whatever order the ring adds in.
"""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tp_from_scratch import collectives as C
from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.testing import random_array, rank_rng

NUMPY_OP = {"sum": np.sum, "max": np.max, "min": np.min}


@st.composite
def cases(draw):
    p = draw(st.integers(1, 6))
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=1, max_size=3)))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    op = draw(st.sampled_from(sorted(NUMPY_OP)))
    dtype = draw(st.sampled_from([np.float64, np.float32, np.int64]))
    seed = draw(st.integers(0, 2**16))
    return p, shape, axis, op, dtype, seed


@settings(max_examples=40, deadline=None)
@given(cases())
def test_every_collective_equals_its_definition(case):
    p, shape, axis, op, dtype, seed = case
    xs = [random_array(rank_rng(seed, r), shape, dtype, integer=True) for r in range(p)]
    originals = [x.copy() for x in xs]
    if 0 in shape and op != "sum":
        op = "sum"  # numpy has no max/min of an empty stack to compare with

    # uneven all-to-all: rank q sends counts[q][d] of its rows to rank d (any split of its rows)
    rows = shape[0]
    counts = [np.bincount(rank_rng(seed + 1, q).integers(0, p, size=rows), minlength=p) for q in range(p)]

    def fn(comm):
        x = xs[comm.rank]
        recv_counts = C.exchange_counts(comm, counts[comm.rank])
        return (C.all_reduce(comm, x, op=op), C.reduce_scatter(comm, x, axis=axis, op=op),
                C.all_gather(comm, x, axis=axis), C.all_to_all(comm, x, axis, 0),
                C.broadcast(comm, x, root=p - 1), C.reduce(comm, x, root=0, op=op),
                C.all_to_all_v(comm, x, counts[comm.rank], recv_counts))

    full = NUMPY_OP[op](np.stack(xs), axis=0).astype(dtype)
    for r, (ar, rs, ag, a2a, bc, red, a2av) in enumerate(run_spmd(fn, p, timeout=20)):
        assert_matches_reference(ar, full, name="all_reduce", rank=r, exact=True)
        assert_matches_reference(rs, np.array_split(full, p, axis=axis)[r], name="reduce_scatter", rank=r, exact=True)
        assert_matches_reference(ag, np.concatenate(xs, axis=axis), name="all_gather", rank=r, exact=True)
        expected = np.concatenate([np.array_split(x, p, axis=axis)[r] for x in xs], axis=0)
        assert_matches_reference(a2a, expected, name="all_to_all", rank=r, exact=True)
        assert_matches_reference(bc, xs[p - 1], name="broadcast", rank=r, exact=True)
        blocks = [np.split(xq, np.cumsum(counts[q])[:-1])[r] for q, xq in enumerate(xs)]
        assert_matches_reference(a2av, np.concatenate(blocks), name="all_to_all_v", rank=r, exact=True)
        if r == 0:
            assert_matches_reference(red, full, name="reduce", rank=r, exact=True)
    for r, (x, x0) in enumerate(zip(xs, originals)):
        assert_matches_reference(x, x0, name="input after the collectives", rank=r, exact=True)
