"""Lesson 10's all-reduce algorithms on the simulator: equal to numpy, equal on every rank, and
sending exactly what their cost formulas say.

Each algorithm runs for p = 1..8 on shapes that most p do not divide (7x5 elements, 3
elements so that some chunks are empty, a 0-d array), in three dtypes: integer-valued
float32 and int32 (exact in any summation order, so compared bit for bit) and gaussian
float64 (within the tolerance policy, and bit-identical across ranks).
"""
import numpy as np
import pytest

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.overlap import algorithms as A
from tp_from_scratch.testing import random_array, rank_rng

WORLD_SIZES = range(1, 9)
SHAPES = [(7, 5), (3,), ()]
CASES = [(np.float32, True), (np.int32, True), (np.float64, False)]  # (dtype, integer-valued)
SMALL_SEGMENT = 8  # bytes: several segments per chunk even for these small arrays


def call(name, comm, x, op="sum"):
    kwargs = {"segment_bytes": SMALL_SEGMENT} if name == "segmented_ring" else {}
    return A.ALGORITHMS[name](comm, x, op=op, **kwargs)


def run_metered(name, xs, op="sum"):
    """Run the algorithm with rank r's input xs[r]; return (results, per-rank meter counts)."""
    def rank_fn(comm):
        comm.meter.reset()
        y = call(name, comm, xs[comm.rank], op)
        m = comm.meter
        return y, (m.messages_sent, m.bytes_sent, m.messages_received, m.bytes_received)
    originals = [x.copy() for x in xs]
    out = run_spmd(rank_fn, len(xs))
    for r, (x, x0, (y, _)) in enumerate(zip(xs, originals, out)):
        assert_matches_reference(x, x0, name=f"{name}: input after the all-reduce", rank=r, exact=True)
        assert not np.shares_memory(x, y), f"rank {r}: {name}'s result is a view of its input"
    return [y for y, _ in out], [counts for _, counts in out]


@pytest.mark.parametrize("p", WORLD_SIZES)
@pytest.mark.parametrize("name", sorted(A.ALGORITHMS))
def test_algorithm_equals_numpy_and_its_traffic_formula(name, p):
    for shape in SHAPES:
        for dtype, integer in CASES:
            xs = [random_array(rank_rng(100 + p, r), shape, dtype, integer=integer) for r in range(p)]
            expected = np.sum(np.stack(xs), axis=0, dtype=dtype)
            results, counts = run_metered(name, xs)
            what = f"{name} p={p} shape={shape} {np.dtype(dtype).name}"
            for r, (y, got) in enumerate(zip(results, counts)):
                assert_matches_reference(y, expected, name=what, rank=r, exact=integer)
                # the sum is computed once per element and copied: every rank has the same bits
                assert_matches_reference(y, results[0], name=f"{what} vs rank 0", rank=r, exact=True)
                formula = A.traffic(name, p, r, int(np.prod(shape)), np.dtype(dtype).itemsize,
                                    segment_bytes=SMALL_SEGMENT)
                assert got == formula, (f"{what}, rank {r}: the meter shows (messages, bytes) sent and "
                                        f"received {got}, its formula says {formula}")


@pytest.mark.parametrize("name", sorted(A.ALGORITHMS))
@pytest.mark.parametrize("op", ["max", "min", "prod"])
def test_every_reduction_op(name, op):
    for p in (3, 4, 6):
        xs = [random_array(rank_rng(200 + p, r), (5, 3), np.float64, integer=True) for r in range(p)]
        expected = {"max": np.max, "min": np.min, "prod": np.prod}[op](np.stack(xs), axis=0)
        for r, y in enumerate(run_metered(name, xs, op)[0]):
            assert_matches_reference(y, expected, name=f"{name} {op} p={p}", rank=r, exact=True)


def test_segmented_ring_adds_in_the_rings_order():
    # the pipeline changes when bytes move, not which numbers are added in which order
    xs = [random_array(rank_rng(300, r), (1001,), np.float32) for r in range(5)]
    ring = run_metered("ring", xs)[0]
    segmented = run_metered("segmented_ring", xs)[0]
    for r, (a, b) in enumerate(zip(ring, segmented)):
        assert_matches_reference(b, a, name="segmented ring vs ring", rank=r, exact=True)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_traffic_matches_the_closed_forms_when_p_divides(p):
    # the exact counts reduce to the docstring's table for a power of two that divides N
    n, itemsize = 64 * p, 4
    nbytes = n * itemsize
    rounds = p.bit_length() - 1
    for r in range(p):
        assert A.traffic("ring", p, r, n, itemsize)[:2] == (2 * (p - 1), 2 * (p - 1) * nbytes // p)
        assert A.traffic("recursive_doubling", p, r, n, itemsize)[:2] == (rounds, rounds * nbytes)
        assert A.traffic("rabenseifner", p, r, n, itemsize)[:2] == (2 * rounds, 2 * (p - 1) * nbytes // p)
        assert A.traffic("segmented_ring", p, r, n, itemsize, segment_bytes=32)[:2] == (
            2 * (p - 1) * 64 * 4 // 32, 2 * (p - 1) * nbytes // p)


def test_folding_costs_the_extra_ranks_one_array_each_way():
    # p = 6: ranks 0 and 2 hand their arrays to 1 and 3, sit out, and get the result back
    n, itemsize = 60, 8
    assert [A.folded_rank(r, 6) for r in range(6)] == [None, 0, None, 1, 2, 3]
    for name in ("recursive_doubling", "rabenseifner"):
        assert A.traffic(name, 6, 0, n, itemsize) == (1, n * itemsize, 1, n * itemsize)
        folded = A.traffic(name, 6, 1, n, itemsize)
        plain = A.traffic(name, 6, 4, n, itemsize)
        assert folded[0] == plain[0] + 1 and folded[1] == plain[1] + n * itemsize


def test_the_prediction_orders_the_algorithms_like_the_textbook():
    # latency-bound: recursive doubling beats the ring; bandwidth-bound: the ring beats it
    alpha, beta = 20e-6, 1e-9
    small, large = 8, 64 * 2 ** 20
    t = lambda name, n: A.predicted_seconds(name, 8, n, alpha, beta)  # noqa: E731
    assert t("recursive_doubling", small) < t("rabenseifner", small) < t("ring", small)
    assert t("ring", large) < t("recursive_doubling", large)
    assert t("rabenseifner", large) < t("ring", large)  # same bytes, fewer messages


TABLE = {"segment_bytes": 1024, "default_backend": "MPIComm",
         "rules": {"MPIComm": {"2": [[100, "recursive_doubling"], [10_000, "rabenseifner"], [None, "ring"]],
                               "4": [[50, "recursive_doubling"], [None, "segmented_ring"]]}}}


def test_selector_follows_the_table_by_size_and_p():
    pick = lambda p, n: A.select_algorithm(TABLE, "SimulatedComm", p, n)  # noqa: E731
    assert pick(2, 100) == ("recursive_doubling", {})
    assert pick(2, 101) == ("rabenseifner", {})
    assert pick(2, 10 ** 9) == ("ring", {})
    assert pick(5, 51) == ("segmented_ring", {"segment_bytes": 1024})  # nearest measured p is 4
    assert pick(3, 8) == ("recursive_doubling", {})  # a tie between 2 and 4 takes 4


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_selected_all_reduce_uses_the_chosen_algorithm(p):
    xs = [random_array(rank_rng(400, r), (40,), np.float32, integer=True) for r in range(p)]

    def rank_fn(comm):
        small = A.all_reduce(comm, xs[comm.rank][:2], table=TABLE)  # 8 bytes
        large = A.all_reduce(comm, xs[comm.rank], table=TABLE)      # 160 bytes
        return small, large, sorted(comm.meter.by_collective)
    expected = np.sum(np.stack(xs), axis=0)
    for r, (small, large, names) in enumerate(run_spmd(rank_fn, p)):
        assert_matches_reference(small, expected[:2], name="selected, 8 bytes", rank=r, exact=True)
        assert_matches_reference(large, expected, name="selected, 160 bytes", rank=r, exact=True)
        if p > 1:
            second = "all_reduce_rabenseifner" if p == 2 else "all_reduce_segmented_ring"
            assert names == sorted(["all_reduce_recursive_doubling", second]), names


def test_the_committed_table_names_real_algorithms():
    table = A.load_table()
    assert table["command"], "the table must say which command measured it"
    for backend, by_p in table["rules"].items():
        for p, rules in by_p.items():
            assert rules[-1][0] is None, f"{backend} p={p}: the last rule must have no upper bound"
            bounds = [b for b, _ in rules[:-1]]
            assert bounds == sorted(bounds), f"{backend} p={p}: bounds out of order {bounds}"
            assert {name for _, name in rules} <= set(A.ALGORITHMS), rules


def test_the_benchmark_turns_measured_winners_into_size_rules():
    from tp_from_scratch.bench.algorithms import NAMES, rules_from_rows

    def row(size, fastest, noise=1.0):
        times = {f"{name}_min_time_us": 100.0 for name in NAMES}
        times[f"{fastest}_min_time_us"] = 50.0 * noise
        return {"size": size, **times}
    rows = [row(8, "recursive_doubling"), row(64, "recursive_doubling"), row(512, "recursive_doubling"),
            row(4096, "ring"), row(32768, "ring", noise=1.9), row(262144, "ring")]
    # a crossover between 512 and 4096 bytes: the bound lies halfway on the log scale
    assert rules_from_rows(rows) == [[1448, "recursive_doubling"], [None, "ring"]]
    # one size won by another algorithm by a hair is noise, judged with its neighbours
    rows[4] = row(32768, "segmented_ring", noise=1.9)
    assert rules_from_rows(rows) == [[1448, "recursive_doubling"], [None, "ring"]]


def test_the_committed_table_covers_p_2_3_4_and_unmeasured_p_takes_the_nearest():
    table = A.load_table()
    for backend in ("MPIComm", "TorchComm"):
        assert {"2", "3", "4"} <= set(table["rules"][backend]), f"{backend}: measured p {sorted(table['rules'][backend])}"
        for n in (8, 2 ** 16, 2 ** 26):
            # p = 5..8 are not measured: they take p = 4's rules
            assert A.select_algorithm(table, backend, 7, n) == A.select_algorithm(table, backend, 4, n)
