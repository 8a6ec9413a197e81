"""Graders for Exercise 2: ring reduce_scatter, all_gather and all_reduce on send and recv.

Every test runs the implementation on p simulated ranks (run_spmd), gives each rank its own
random data (rank_rng(seed, rank)), and compares every rank's result with plain numpy on
the stacked inputs, through the course's one comparison helper. Integer-valued data makes
sums exact in every order, so those comparisons are bit for bit.

Two more kinds of check prove it is a *ring*, not just a correct answer:
  * cost: the meter's bytes per rank must match the ring's (p-1)/p and 2(p-1)/p of the
    array, up to the rounding of uneven chunks;
  * topology: a rank may send to only one neighbour and receive from the other.

A deadlock is not a hang: the simulator names who waits on whom, within GRADER_TIMEOUT.
"""
import numpy as np
import pytest

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.sharding import shard_sizes
from tp_from_scratch.testing import random_array, rank_rng
from tp_from_scratch.tools.grading import assert_not_aliased

# world sizes: 1 (nothing to send), 2, and several that are not powers of two
WORLD_SIZES = [1, 2, 3, 4, 7]
GRADER_TIMEOUT = 10.0  # seconds; a blocked ring fails with the simulator's message instead


def spmd(fn, p):
    """fn(comm) on p simulated ranks; returns the per-rank results."""
    return run_spmd(fn, p, timeout=GRADER_TIMEOUT)


def inputs(seed, p, shape, dtype=np.float64, integer=True):
    """Each rank's input, rank-distinct; the test regenerates them to build the reference."""
    return [random_array(rank_rng(seed, r), shape(r) if callable(shape) else shape, dtype, integer)
            for r in range(p)]


# ---------------------------------------------------------------- reduce_scatter

@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("p", WORLD_SIZES)
def test_reduce_scatter_sum_gives_each_rank_its_array_split_chunk(impl, p, axis):
    # 11 and 13 are divisible by none of the world sizes > 1: the chunks are uneven
    xs = inputs(10 + axis, p, (11, 13))
    expected = np.array_split(np.sum(xs, axis=0), p, axis=axis)
    got = spmd(lambda comm: impl.reduce_scatter(comm, xs[comm.rank].copy(), axis=axis), p)
    for rank in range(p):
        assert_matches_reference(got[rank], expected[rank], name="reduce_scatter chunk", rank=rank, exact=True)


@pytest.mark.parametrize("p", [3, 4])
def test_reduce_scatter_max(impl, p):
    xs = inputs(12, p, (17,), np.float32, integer=False)
    expected = np.array_split(np.max(xs, axis=0), p)
    got = spmd(lambda comm: impl.reduce_scatter(comm, xs[comm.rank].copy(), op="max"), p)
    for rank in range(p):
        # max never rounds: bit-exact whatever the order
        assert_matches_reference(got[rank], expected[rank], name="reduce_scatter max chunk", rank=rank, exact=True)


# ---------------------------------------------------------------- all_gather

@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("p", WORLD_SIZES)
def test_all_gather_concatenates_unequal_shards_in_rank_order(impl, p, axis):
    # rank r holds 1 + r % 3 rows (axis 0) or columns (axis 1): shards of unequal length
    shape = (lambda r: (1 + r % 3, 4)) if axis == 0 else (lambda r: (3, 1 + r % 3))
    xs = inputs(20 + axis, p, shape, integer=False)
    expected = np.concatenate(xs, axis=axis)
    got = spmd(lambda comm: impl.all_gather(comm, xs[comm.rank].copy(), axis=axis), p)
    for rank in range(p):
        # all_gather only moves data: every bit must arrive
        assert_matches_reference(got[rank], expected, name="all_gather result", rank=rank, exact=True)


# ---------------------------------------------------------------- all_reduce

@pytest.mark.parametrize("p", WORLD_SIZES + [8])
@pytest.mark.parametrize("shape", [(5, 3), (6,)], ids=["5x3", "len6"])
def test_all_reduce_sum_equals_numpy_sum_on_every_rank(impl, p, shape):
    # (6,) on 7 or 8 ranks: some ranks' chunks are empty, which the ring must survive
    xs = inputs(30, p, shape)
    expected = np.sum(xs, axis=0)
    got = spmd(lambda comm: impl.all_reduce(comm, xs[comm.rank].copy()), p)
    for rank in range(p):
        assert_matches_reference(got[rank], expected, name="all_reduce result", rank=rank, exact=True)


@pytest.mark.parametrize("p", [3, 4])
def test_all_reduce_float32_within_the_summation_order_tolerance(impl, p):
    xs = inputs(31, p, (4, 9), np.float32, integer=False)
    expected = np.sum(xs, axis=0)  # float32, rank order: the ring adds in another order
    got = spmd(lambda comm: impl.all_reduce(comm, xs[comm.rank].copy()), p)
    for rank in range(p):
        assert_matches_reference(got[rank], expected, name="all_reduce float32 result", rank=rank)


@pytest.mark.parametrize("p", [2, 5])
def test_all_reduce_max(impl, p):
    xs = inputs(32, p, (3, 7), integer=False)
    expected = np.max(xs, axis=0)
    got = spmd(lambda comm: impl.all_reduce(comm, xs[comm.rank].copy(), op="max"), p)
    for rank in range(p):
        assert_matches_reference(got[rank], expected, name="all_reduce max result", rank=rank, exact=True)


# ---------------------------------------------------------------- every promised dtype

@pytest.mark.parametrize("dtype", [np.float32, np.int64])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather", "all_reduce"])
def test_every_collective_keeps_the_dtype(impl, collective, dtype):
    # float64 is graded above; the stub promises x's dtype back for float32 and integers too
    # (integer-valued data: sums are exact in any order, so the comparison is bit for bit)
    p = 3
    xs = [x.astype(dtype) for x in inputs(45, p, (1 + p, 5))]
    expected = {"reduce_scatter": np.array_split(np.sum(xs, axis=0), p), "all_gather": [np.concatenate(xs)] * p,
                "all_reduce": [np.sum(xs, axis=0)] * p}[collective]
    got = spmd(lambda comm: getattr(impl, collective)(comm, xs[comm.rank].copy()), p)
    for rank in range(p):
        assert_matches_reference(got[rank], expected[rank].astype(dtype), name=f"{collective} of {np.dtype(dtype)}",
                                 rank=rank, exact=True)


# ---------------------------------------------------------------- the caller's input is sacred

@pytest.mark.parametrize("p", [1, 3])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather", "all_reduce"])
def test_input_is_never_modified_and_the_result_is_a_new_array(impl, collective, p):
    # p = 1 too: one rank has nothing to send, but handing back x (or a view of it) as the
    # result would let a caller who writes into the result change its input
    xs = inputs(40, p, (7, 2))
    fn = getattr(impl, collective)
    given = [x.copy() for x in xs]  # the arrays handed to the collective
    results = spmd(lambda comm: fn(comm, given[comm.rank]), p)
    for rank in range(p):
        assert_matches_reference(given[rank], xs[rank], name=f"input of {collective} (must not change)",
                                 rank=rank, exact=True)
        assert_not_aliased(results[rank], [given[rank]], f"the result of {collective}", rank)


# ---------------------------------------------------------------- cost: the meter's bytes

def metered(fn, p):
    """Run fn(comm) on p ranks; per rank (bytes sent, bytes received) during fn only."""
    def body(comm):
        sent, received = comm.meter.bytes_sent, comm.meter.bytes_received
        fn(comm)
        return comm.meter.bytes_sent - sent, comm.meter.bytes_received - received
    return spmd(body, p)


def assert_bytes_within(got, low, high, what, rank):
    assert low <= got <= high, (
        f"{what} on rank {rank}: {got} bytes, but a ring moves between {low} and {high} bytes "
        f"(see the cost model in lessons/02_collectives.ipynb)")


@pytest.mark.parametrize("p", [3, 5])
def test_reduce_scatter_sends_p_minus_1_over_p_of_the_array(impl, p):
    n = 20 * p + 1  # uneven chunks on purpose
    xs = inputs(50, p, (n,))
    s = xs[0].itemsize
    sizes = shard_sizes(n, p)
    traffic = metered(lambda comm: impl.reduce_scatter(comm, xs[comm.rank].copy()), p)
    for rank, (sent, received) in enumerate(traffic):
        # each step moves one chunk: p - 1 chunks out, p - 1 chunks in
        for what, got in [("bytes sent", sent), ("bytes received", received)]:
            assert_bytes_within(got, (p - 1) * min(sizes) * s, (p - 1) * max(sizes) * s,
                                f"reduce_scatter {what}", rank)


@pytest.mark.parametrize("p", [3, 5])
def test_all_gather_sends_p_minus_1_shards(impl, p):
    xs = inputs(51, p, lambda r: (10 + r % 2,))
    s = xs[0].itemsize
    total = sum(x.size for x in xs)
    traffic = metered(lambda comm: impl.all_gather(comm, xs[comm.rank].copy()), p)
    for rank, (sent, received) in enumerate(traffic):
        # a rank must receive every shard but its own, exactly once
        assert received == (total - xs[rank].size) * s, (
            f"all_gather bytes received on rank {rank}: {received}, expected {(total - xs[rank].size) * s} "
            "(every other rank's shard, once)")
        assert_bytes_within(sent, (p - 1) * 10 * s, (p - 1) * 11 * s, "all_gather bytes sent", rank)


@pytest.mark.parametrize("p", [3, 4, 5])
def test_all_reduce_sends_2_p_minus_1_over_p_of_the_array(impl, p):
    n = 30 * p + 2
    xs = inputs(52, p, (n,))
    s = xs[0].itemsize
    sizes = shard_sizes(n, p)
    traffic = metered(lambda comm: impl.all_reduce(comm, xs[comm.rank].copy()), p)
    for rank, (sent, received) in enumerate(traffic):
        # reduce-scatter then all-gather: 2(p-1) chunks each way, not (p-1) whole arrays
        for what, got in [("bytes sent", sent), ("bytes received", received)]:
            assert_bytes_within(got, 2 * (p - 1) * min(sizes) * s, 2 * (p - 1) * max(sizes) * s,
                                f"all_reduce {what}", rank)
    assert sum(sent for sent, _ in traffic) == 2 * (p - 1) * n * s, "all ranks together: 2(p-1) arrays"


def test_all_reduce_of_a_2d_array_balances_the_flattened_elements(impl):
    # (2, 100) on 4 ranks: chunks of the 200 flattened elements are 50 each, so every rank
    # sends exactly 2 * 3 * 50 elements. Chunking along axis 0 instead (rows of 100, and two
    # ranks with nothing) gives the right sum but unbalanced traffic.
    p, shape = 4, (2, 100)
    xs = inputs(53, p, shape)
    s = xs[0].itemsize
    traffic = metered(lambda comm: impl.all_reduce(comm, xs[comm.rank].copy()), p)
    balanced = 2 * (p - 1) * (xs[0].size // p) * s
    for rank, (sent, received) in enumerate(traffic):
        for what, got in [("bytes sent", sent), ("bytes received", received)]:
            assert got == balanced, (
                f"all_reduce {what} on rank {rank} for a {shape} array on {p} ranks: {got}, expected "
                f"{balanced}; chunk the flattened elements (x.reshape(-1)), not the rows")


# ---------------------------------------------------------------- topology: a ring

class RecordingComm:
    """The rank's communicator, passed through untouched, noting every peer it talks to."""

    def __init__(self, comm):
        self._comm = comm
        self.sent_to, self.received_from = set(), set()

    def send(self, array, dst, *args, **kwargs):
        self.sent_to.add(dst)
        return self._comm.send(array, dst, *args, **kwargs)

    def recv(self, src, *args, **kwargs):  # the library's recv also takes out= and header=
        self.received_from.add(src)
        return self._comm.recv(src, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._comm, name)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather", "all_reduce"])
def test_each_rank_talks_only_to_its_ring_neighbours(impl, collective):
    p = 4
    xs = inputs(60, p, (9,))
    fn = getattr(impl, collective)

    def body(comm):
        recording = RecordingComm(comm)
        fn(recording, xs[comm.rank].copy())
        return recording.sent_to, recording.received_from

    for rank, (sent_to, received_from) in enumerate(spmd(body, p)):
        right, left = (rank + 1) % p, (rank - 1) % p
        # one direction around the ring (either one): send to one neighbour, hear from the other
        assert sent_to in ({right}, {left}), f"{collective}: rank {rank} sent to ranks {sorted(sent_to)}"
        assert received_from == {left, right} - sent_to, (
            f"{collective}: rank {rank} sent to {sorted(sent_to)} but received from {sorted(received_from)}")
