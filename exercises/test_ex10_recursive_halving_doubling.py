"""Graders for Exercise 10: the recursive halving-doubling (Rabenseifner) all-reduce.

Each test runs the implementation on p simulated ranks (run_spmd), gives each rank its own
random data (rank_rng(seed, rank)) and compares every rank's result with numpy on the
stacked inputs, through the course's comparison helper. Integer-valued data adds exactly in
any order, so those comparisons are bit for bit.

A correct sum is not enough: the ring or recursive doubling also compute it. What makes it
Rabenseifner is checked on the meter (2 log2 p2 messages per rank, halving and doubling the
bytes, plus the fold for p that are not powers of two) and on who talks to whom.
"""
import numpy as np
import pytest

from tp_from_scratch.comm import SPMDError
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.sharding import shard_sizes
from tp_from_scratch.testing import random_array, rank_rng
from tp_from_scratch.tools.grading import run_graded

WORLD_SIZES = range(1, 9)  # 3, 5, 6, 7 need the fold
GRADER_TIMEOUT = 10.0  # seconds; a blocked exchange fails with the simulator's message instead


OUT_OF_RANGE_HINT = (
    "Hint: an index or a shape out of range during the exchange usually means the ranks disagree on "
    "who owns which chunk. While halving, the rank whose bit is 0 keeps the LOWER half and sends the "
    "upper one, so that after log2 p2 rounds rank v owns chunk v; the doubling then sends that chunk "
    "and the blocks it has gathered since (see lessons/10_overlap.ipynb).")


def spmd(fn, p):
    """Every rank's result; a rank's IndexError or ValueError comes with the hint above."""
    __tracebackhide__ = True
    try:
        return run_graded(fn, p, timeout=GRADER_TIMEOUT)
    except SPMDError as error:
        if isinstance(error.error, (IndexError, ValueError)):
            raise AssertionError(f"{error}\n{OUT_OF_RANGE_HINT}") from error
        raise


def inputs(seed, p, shape, dtype=np.float64, integer=True):
    return [random_array(rank_rng(seed, r), shape, dtype, integer) for r in range(p)]


def run(impl, xs, op="sum"):
    """Every rank's result, for rank r's input xs[r] (a copy: the originals stay to compare)."""
    given = [x.copy() for x in xs]
    return spmd(lambda comm: impl.all_reduce_rabenseifner(comm, given[comm.rank], op=op), len(xs))


# ---------------------------------------------------------------- the result

@pytest.mark.parametrize("p", WORLD_SIZES)
@pytest.mark.parametrize("shape", [(7, 5), (3,)], ids=["7x5", "len3"])
def test_sum_equals_numpy_on_every_rank(impl, p, shape):
    # 35 and 3 elements: uneven chunks, and empty ones when p > 3
    xs = inputs(90, p, shape)
    expected = np.sum(xs, axis=0)
    for rank, got in enumerate(run(impl, xs)):
        assert_matches_reference(got, expected, name=f"all_reduce_rabenseifner p={p}", rank=rank, exact=True)


@pytest.mark.parametrize("p", [3, 4, 6])
def test_float32_within_tolerance_and_the_same_bits_on_every_rank(impl, p):
    xs = inputs(91, p, (4, 9), np.float32, integer=False)
    got = run(impl, xs)
    for rank, y in enumerate(got):
        assert_matches_reference(y, np.sum(xs, axis=0), name="float32 sum", rank=rank)
        # each chunk is added once, on its owner, then copied: no rank may differ in any bit
        assert_matches_reference(y, got[0], name="float32 sum vs rank 0's", rank=rank, exact=True)


@pytest.mark.parametrize("op", ["max", "min", "prod"])
def test_other_reductions(impl, op):
    p = 5
    xs = inputs(92, p, (6, 2))
    expected = {"max": np.max, "min": np.min, "prod": np.prod}[op](xs, axis=0)
    for rank, got in enumerate(run(impl, xs, op)):
        assert_matches_reference(got, expected, name=f"all_reduce_rabenseifner {op}", rank=rank, exact=True)


@pytest.mark.parametrize("p", [3, 4])
def test_a_0d_int_array_stays_0d_and_int(impl, p):
    xs = [np.array(r + 1, dtype=np.int32) for r in range(p)]
    for rank, got in enumerate(run(impl, xs)):
        assert_matches_reference(got, np.array(p * (p + 1) // 2, dtype=np.int32), name="0-d sum", rank=rank)


def test_extreme_magnitudes_add_exactly(impl):
    # multiples of 2**1000 add exactly in float64: nothing may rescale or overflow on the way
    p = 6
    xs = [x * 2.0 ** 1000 for x in inputs(93, p, (11,))]
    for rank, got in enumerate(run(impl, xs)):
        assert_matches_reference(got, np.sum(xs, axis=0), name="sum of values near 2**1003", rank=rank, exact=True)
    xs = [np.where(x > 0, np.inf, -np.inf) for x in inputs(94, p, (5,))]
    for rank, got in enumerate(run(impl, xs, "max")):
        assert_matches_reference(got, np.max(xs, axis=0), name="max of infinities", rank=rank, exact=True)


@pytest.mark.parametrize("p", [1, 3, 6])  # p = 1 too: nothing to add, but still a new array
def test_input_untouched_and_result_new(impl, p):
    xs = inputs(95, p, (8,))
    given = [x.copy() for x in xs]
    got = spmd(lambda comm: impl.all_reduce_rabenseifner(comm, given[comm.rank]), p)
    for rank in range(p):
        assert_matches_reference(given[rank], xs[rank], name="input (must not change)", rank=rank, exact=True)
        assert not np.shares_memory(got[rank], given[rank]), (
            f"rank {rank} of {p}: the result shares memory with the input (the input itself, or a view "
            f"of it); return a new array (np.copy), at p = 1 too")


# ---------------------------------------------------------------- the cost and the partners

def folded(rank, p):
    """(p2, this rank's index among the p2 that stay, or None if it sits out)."""
    p2 = 1 << (p.bit_length() - 1)
    rem = p - p2
    if rank < 2 * rem:
        return p2, (rank // 2 if rank % 2 else None)
    return p2, rank - rem


def expected_traffic(p, rank, count, itemsize):
    """(messages sent, bytes sent) of Rabenseifner's algorithm with the fold, worked out here."""
    p2, v = folded(rank, p)
    if p == 1:
        return 0, 0
    if v is None:
        return 1, count * itemsize  # the whole array to the partner, once
    chunk = [n * itemsize for n in shard_sizes(count, p2)]
    rounds = p2.bit_length() - 1
    # halving: the chunks given away are every chunk but those of the final half, i.e. all
    # but chunk v; doubling: what it owns doubles, 1, 2, 4... chunks, so all but the last half
    lo, hi, mask, sent = 0, p2, p2 // 2, 0
    while mask:
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if not v & mask else ((mid, hi), (lo, mid))
        sent += sum(chunk[give[0]:give[1]])
        lo, hi, mask = keep[0], keep[1], mask // 2
    mask = 1
    while mask < p2:
        sent += sum(chunk[lo:hi])
        other = (v ^ mask) & ~(mask - 1)
        lo, hi, mask = min(lo, other), max(hi, other + mask), mask * 2
    back = 1 if rank < 2 * (p - p2) else 0  # the result, to the rank that sat out
    return 2 * rounds + back, sent + back * count * itemsize


@pytest.mark.parametrize("p", range(2, 9))
def test_messages_and_bytes_are_rabenseifners(impl, p):
    n = 10 * p + 3
    xs = inputs(96, p, (n,))

    def body(comm):
        comm.meter.reset()
        impl.all_reduce_rabenseifner(comm, xs[comm.rank].copy())
        return comm.meter.messages_sent, comm.meter.bytes_sent
    for rank, got in enumerate(spmd(body, p)):
        want = expected_traffic(p, rank, n, 8)
        assert got == want, (
            f"rank {rank} of {p}: sent {got[0]} messages, {got[1]} bytes; recursive halving-doubling "
            f"sends {want[0]} messages, {want[1]} bytes (see lessons/10_overlap.ipynb)")


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


def partners(rank, p):
    """The ranks Rabenseifner's rank talks to: its fold neighbour and its log2 p2 partners."""
    p2, v = folded(rank, p)
    rem = p - p2
    if v is None:
        return {rank + 1}
    real = lambda u: 2 * u + 1 if u < rem else u + rem  # noqa: E731
    fold = {rank - 1} if rank < 2 * rem else set()
    return fold | {real(v ^ (1 << k)) for k in range(p2.bit_length() - 1)}


@pytest.mark.parametrize("p", [4, 6, 8])
def test_talks_only_to_its_partners(impl, p):
    xs = inputs(97, p, (20,))

    def body(comm):
        recording = RecordingComm(comm)
        impl.all_reduce_rabenseifner(recording, xs[comm.rank].copy())
        return recording.peers
    for rank, peers in enumerate(spmd(body, p)):
        assert peers == partners(rank, p), (
            f"rank {rank} of {p} talked to {sorted(peers)}; recursive halving-doubling talks to "
            f"{sorted(partners(rank, p))} (rank XOR 1, 2, 4... among the folded ranks)")
