"""The all-to-all with uneven counts (token dispatch's collective), on the simulator, world
sizes 1..8, against the single-device definition: rank r ends with, in source order, the
block every rank addressed to r. Held to what the other collectives are held to: odd p,
empty blocks, bytes on the wire = the formula, the input untouched, a deadlock named.
"""
import numpy as np
import pytest

from tp_from_scratch import collectives as C
from tp_from_scratch.comm import SPMDError, run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.testing import random_array, rank_rng

WORLD_SIZES = range(1, 9)


def uneven_counts(p, seed):
    """counts[q][d]: rows rank q sends rank d; zeros included, no two ranks alike."""
    return [rank_rng(seed, q).integers(0, 4, size=p) for q in range(p)]


def dispatch(comm, x, send_counts):
    recv_counts = C.exchange_counts(comm, send_counts)
    return C.all_to_all_v(comm, x, send_counts, recv_counts), recv_counts


@pytest.mark.parametrize("p", WORLD_SIZES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64])
def test_all_to_all_v_delivers_every_block_in_source_order(p, dtype):
    counts = uneven_counts(p, 100 + p)
    xs = [random_array(rank_rng(200 + p, q), (int(counts[q].sum()), 3, 2), dtype, integer=True)
          for q in range(p)]
    originals = [x.copy() for x in xs]
    out = run_spmd(lambda comm: dispatch(comm, xs[comm.rank], counts[comm.rank]), p)
    for r, (y, recv_counts) in enumerate(out):
        blocks = [np.split(xs[q], np.cumsum(counts[q])[:-1])[r] for q in range(p)]
        assert_matches_reference(y, np.concatenate(blocks), name="all_to_all_v", rank=r, exact=True)
        assert list(recv_counts) == [counts[q][r] for q in range(p)], f"rank {r}: recv_counts"
        assert not np.shares_memory(y, xs[r]), f"rank {r}: the result is a view of the input"
    for r, (x, x0) in enumerate(zip(xs, originals)):
        assert_matches_reference(x, x0, name="input after all_to_all_v", rank=r, exact=True)


@pytest.mark.parametrize("p", WORLD_SIZES)
def test_all_to_all_v_costs_the_formula(p):
    """p-1 messages; (sum_d c_d - c_r) rows of bytes sent; the counts: p-1 messages of 8 bytes."""
    counts = uneven_counts(p, 300 + p)
    row_bytes = 5 * 8

    def fn(comm):
        c = counts[comm.rank]
        recv_counts = C.exchange_counts(comm, c)
        comm.meter.reset()
        C.all_to_all_v(comm, np.ones((int(c.sum()), 5)), c, recv_counts)
        return comm.meter.snapshot()

    for r, m in enumerate(run_spmd(fn, p)):
        sent = (int(counts[r].sum()) - int(counts[r][r])) * row_bytes
        received = sum(int(counts[q][r]) for q in range(p) if q != r) * row_bytes
        assert (m["messages_sent"], m["bytes_sent"]) == (p - 1, sent), r
        assert m["bytes_received"] == received, r
        assert m["by_collective"]["all_to_all_v"]["calls"] == 1


def test_counts_not_exchanged_are_caught_not_silently_misread():
    """A receiver that guesses its counts (here: equal blocks) receives into a buffer of the
    wrong size; the simulator names the mismatch instead of returning shuffled rows."""
    def fn(comm):
        send = np.array([1, 2]) if comm.rank == 0 else np.array([2, 1])
        return C.all_to_all_v(comm, np.ones((3, 2)), send, [1, 1])

    with pytest.raises(SPMDError, match=r"recv from rank [01] into an array of shape"):
        run_spmd(fn, 2, timeout=10)


def test_a_rank_that_skips_the_all_to_all_is_a_named_deadlock():
    def fn(comm):
        if comm.rank == 1:
            comm.barrier()  # forgot the dispatch: waits where rank 0 never comes
        else:
            C.all_to_all_v(comm, np.ones((2, 1)), [1, 1], [1, 1])

    with pytest.raises(SPMDError, match=r"deadlock: rank 0 waits for a message from rank 1 \(in all_to_all_v\); rank 1 waits in barrier"):
        run_spmd(fn, 2, timeout=10)


@pytest.mark.parametrize("counts, match", [
    ([1, 2, 3], r"send_counts must be 2 non-negative integers, one per rank"),
    ([1, -1], r"send_counts must be 2 non-negative integers"),
    ([1.0, 1.0], r"send_counts must be 2 non-negative integers"),
    ([2, 2], r"send_counts \[2, 2\] add up to 4 rows, but x has 3"),
])
def test_bad_counts_are_named(counts, match):
    with pytest.raises(SPMDError, match=match):
        run_spmd(lambda comm: C.all_to_all_v(comm, np.ones((3, 1)), counts, [0, 0]), 2, timeout=10)
