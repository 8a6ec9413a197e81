"""Four all-reduce algorithms, and a selector that picks one by message size and world size.

Every function has the contract of ``collectives.all_reduce(comm, x, op="sum")``: any world
size p >= 1, any shape (0-d included), the input untouched, a new result that holds the
same bits on every rank. Only comm.send and comm.recv are used.

Which algorithm wins depends on the message. Sending n bytes costs alpha + n * beta
(alpha: latency per message, beta: seconds per byte). For an array of N bytes, per rank
(p2 = the largest power of two <= p; "fold": non-powers of two first fold the extra
p - p2 ranks into neighbours and send them the result at the end, +2 messages of N):

    algorithm            messages          bytes sent           best for
    recursive doubling   log2 p2 (+fold)   N log2 p2 (+fold)    small N: fewest messages
    ring                 2(p-1)            2 (p-1)/p N          large N: fewest bytes
    Rabenseifner         2 log2 p2 (+fold) 2 (p2-1)/p2 N        medium and large N, fewer
                                                                messages than the ring
    segmented ring       the ring's, x segments per chunk       large N: the reduction of one
                                                                segment overlaps the transfer
                                                                of the next (a pipeline)

``traffic(algorithm, p, rank, count, itemsize)`` gives the exact counts of each (what the
meter must show), ``predicted_seconds`` the alpha-beta time of its critical path.
``all_reduce(comm, x, op, table)`` picks an algorithm from thresholds measured on this
machine (lessons/measurements/allreduce_algorithms.json, written by
``.venv/bin/python -m tp_from_scratch.bench algorithms --write-table ...``), like MPICH's
and NCCL's tuning tables.
"""
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from tp_from_scratch import collectives
from tp_from_scratch.collectives import _combine
from tp_from_scratch.sharding import shard_sizes

DEFAULT_SEGMENT_BYTES = 2 ** 18  # the segmented ring's default; the measured table may set another
TABLE_PATH = Path(__file__).resolve().parents[2] / "lessons" / "measurements" / "allreduce_algorithms.json"


# ---------------------------------------------------------------------------------------
# Folding a non-power-of-two world into a power of two (MPICH's "rem" ranks)
# ---------------------------------------------------------------------------------------

def power_of_two_below(p):
    """The largest power of two <= p."""
    return 1 << (p.bit_length() - 1)


def folded_rank(rank, p):
    """This rank's index among the p2 ranks that stay after the fold, or None if it sits out.

    With rem = p - p2 extra ranks, the first 2*rem ranks pair up: even rank 2i hands its
    data to odd rank 2i+1 and waits; rank 2i+1 becomes i. Ranks >= 2*rem become rank - rem.
    """
    rem = p - power_of_two_below(p)
    if rank < 2 * rem:
        return rank // 2 if rank % 2 else None
    return rank - rem


def real_rank(folded, p):
    """The inverse of folded_rank: the real rank that plays folded rank ``folded``."""
    rem = p - power_of_two_below(p)
    return 2 * folded + 1 if folded < rem else folded + rem


def _fold(comm, partial, combine):
    """Fold step: even ranks < 2*rem send their array to the next rank, which adds it.

    The lower rank's data always comes first in the sum, so the order of the addition
    does not depend on who computes it. Returns this rank's partial (or None if it sits out).
    """
    p, r = comm.world_size, comm.rank
    if folded_rank(r, p) is None:
        comm.send(partial, r + 1, header=False)
        return None
    if r < 2 * (p - power_of_two_below(p)):
        lower = comm.recv(r - 1, out=np.empty_like(partial), header=False)
        return combine(lower, partial, out=lower)
    return partial


def _unfold(comm, result):
    """Hand the result to the ranks that sat out (each gets one message of the whole array)."""
    p, r = comm.world_size, comm.rank
    if folded_rank(r, p) is None:
        return comm.recv(r + 1, out=result, header=False)
    if r < 2 * (p - power_of_two_below(p)):
        comm.send(result, r - 1, header=False)
    return result


# ---------------------------------------------------------------------------------------
# The algorithms
# ---------------------------------------------------------------------------------------

def all_reduce_ring(comm, x, op="sum"):
    """Ring all-reduce (reduce-scatter ring, then all-gather ring): Lesson 2's collectives.all_reduce.

    Cost per rank: 2(p-1) messages, 2(p-1)/p N bytes: bandwidth-optimal, latency linear in p.
    """
    return collectives.all_reduce(comm, x, op=op)


def all_reduce_recursive_doubling(comm, x, op="sum"):
    """Recursive doubling: log2 p rounds in which partners 2^k apart swap whole partial sums.

    Round k: folded rank v exchanges its partial with v XOR 2^k and adds (lower rank's
    partial first, so both partners hold the same bits). After log2 p2 rounds every rank
    holds the sum over all. Non-powers of two fold first (see folded_rank).
    Cost per rank: log2 p2 messages of N bytes (+1 for the fold): latency-optimal,
    but every round moves the whole array.
    """
    x = np.asarray(x)
    combine = _combine(op)
    p = comm.world_size
    with comm.collective("all_reduce_recursive_doubling", x, shape=x.shape, dtype=x.dtype, op=op):
        partial = _fold(comm, np.array(x, copy=True), combine)
        if partial is not None:
            v, p2 = folded_rank(comm.rank, p), power_of_two_below(p)
            mask = 1
            while mask < p2:
                partner = real_rank(v ^ mask, p)
                comm.send(partial, partner, header=False)
                theirs = comm.recv(partner, out=np.empty_like(partial), header=False)
                lower, upper = (partial, theirs) if v & mask == 0 else (theirs, partial)
                partial = combine(lower, upper, out=theirs)
                mask <<= 1
        return _unfold(comm, np.empty_like(x) if partial is None else partial)


def _chunk_bounds(count, p2):
    """Element offsets of the p2 chunks of a flat array of ``count`` elements (array_split)."""
    return np.concatenate([[0], np.cumsum(shard_sizes(count, p2))]).astype(int)


def all_reduce_rabenseifner(comm, x, op="sum"):
    """Rabenseifner's all-reduce: reduce-scatter by recursive halving, all-gather by doubling.

    The flat array is cut into p2 chunks (array_split). Halving: in the round with mask m
    (p2/2, p2/4, ..., 1) folded rank v and v XOR m split the chunks they are still
    responsible for in two; the rank with bit m clear keeps the lower half, sends the upper
    one, and adds what its partner sends. After log2 p2 rounds v owns the full sum of chunk v.
    Doubling: the same pairs in reverse order swap the chunks they own, which doubles them
    each round, until every rank holds every chunk. Non-powers of two fold first.
    Each chunk is added on its owner only and then copied, so all ranks hold the same bits.
    Cost per rank: 2 log2 p2 messages, 2(p2-1)/p2 N bytes (+ the fold's 1 message of N).
    """
    x = np.asarray(x)
    combine = _combine(op)
    p = comm.world_size
    with comm.collective("all_reduce_rabenseifner", x, shape=x.shape, dtype=x.dtype, op=op):
        partial = _fold(comm, np.array(x, copy=True).reshape(-1), combine)  # (N,)
        if partial is not None:
            _halving_doubling(comm, partial, combine)
        out = np.empty(x.size, x.dtype) if partial is None else partial
        return _unfold(comm, out).reshape(x.shape)


def _halving_doubling(comm, flat, combine):
    """Recursive halving then doubling on the folded ranks, in place on ``flat`` (N,)."""
    p2 = power_of_two_below(comm.world_size)
    v = folded_rank(comm.rank, comm.world_size)
    bounds = _chunk_bounds(flat.size, p2)
    lo, hi = 0, p2  # chunks this rank is still responsible for
    mask = p2 // 2
    while mask >= 1:  # reduce-scatter by recursive halving
        partner = real_rank(v ^ mask, comm.world_size)
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if v & mask == 0 else ((mid, hi), (lo, mid))
        comm.send(flat[bounds[give[0]]:bounds[give[1]]], partner, header=False)
        mine = flat[bounds[keep[0]]:bounds[keep[1]]]
        theirs = comm.recv(partner, out=np.empty_like(mine), header=False)
        lower, upper = (mine, theirs) if v & mask == 0 else (theirs, mine)
        combine(lower, upper, out=mine)
        lo, hi = keep
        mask //= 2
    mask = 1
    while mask < p2:  # all-gather by recursive doubling: partners swap what they own
        partner = real_rank(v ^ mask, comm.world_size)
        other_lo = (v ^ mask) & ~(mask - 1)  # the partner owns chunks [other_lo, other_lo + mask)
        # (the partner's chunks are the half this rank sent away while halving: overwriting
        # them is safe, the partner received them before it could start doubling)
        comm.send(flat[bounds[lo]:bounds[hi]], partner, header=False)
        comm.recv(partner, out=flat[bounds[other_lo]:bounds[other_lo + mask]], header=False)
        lo, hi = min(lo, other_lo), max(hi, other_lo + mask)
        mask <<= 1


def segments(chunk, segment_elements):
    """Views cutting ``chunk`` into pieces of at most ``segment_elements`` (one, maybe empty, at least)."""
    pieces = max(1, -(-chunk.size // segment_elements))
    return np.array_split(chunk, pieces)


def all_reduce_segmented_ring(comm, x, op="sum", segment_bytes=DEFAULT_SEGMENT_BYTES):
    """The ring all-reduce with every chunk cut into segments that travel as a pipeline.

    The plain ring sends a whole chunk, waits for a whole chunk, adds, and only then sends
    the next. Here each segment of a received partial is added and forwarded at once, so
    while this rank adds segment j, segment j+1 is already on the wire and the right
    neighbour is already adding segment j (NCCL's ring works on such slices). The additions
    are the ring's, in the ring's order: the result has the same bits as all_reduce_ring.
    Cost per rank: the ring's bytes; messages = the ring's 2(p-1) chunks, each counted as
    its number of segments of at most ``segment_bytes``.
    """
    x = np.asarray(x)
    combine = _combine(op)
    p, r = comm.world_size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    with comm.collective("all_reduce_segmented_ring", x, shape=x.shape, dtype=x.dtype, op=op,
                         segment_bytes=segment_bytes):
        flat = x.reshape(-1)  # (N,), only read
        out = np.empty_like(flat)
        if p == 1:
            out[...] = flat
            return out.reshape(x.shape)
        per_segment = max(1, segment_bytes // max(1, x.itemsize))
        mine = [segments(c, per_segment) for c in np.array_split(flat, p)]
        result = [segments(c, per_segment) for c in np.array_split(out, p)]  # views into out
        for piece in mine[left]:  # step 0 of the reduce-scatter: my own piece of chunk r-1
            comm.send(piece, right, header=False)
        for step in range(p - 1):  # reduce-scatter: receive chunk (r-step-2)'s partial
            chunk = (r - step - 2) % p
            for j, piece in enumerate(mine[chunk]):
                last = step == p - 2  # chunk r: its sum lands in the result
                buffer = result[chunk][j] if last else np.empty_like(piece)
                incoming = comm.recv(left, out=buffer, header=False)
                combine(incoming, piece, out=incoming)
                comm.send(incoming, right, header=False)  # next step's partial, or (last) chunk r
        for step in range(p - 1):  # all-gather: receive chunk (r-step-1), forward it
            chunk = (r - step - 1) % p
            for piece in result[chunk]:
                comm.recv(left, out=piece, header=False)
                if step < p - 2:
                    comm.send(piece, right, header=False)
        return out.reshape(x.shape)


ALGORITHMS = {
    "ring": all_reduce_ring,
    "recursive_doubling": all_reduce_recursive_doubling,
    "rabenseifner": all_reduce_rabenseifner,
    "segmented_ring": all_reduce_segmented_ring,
}


# ---------------------------------------------------------------------------------------
# Cost model: exact counts per rank, and the alpha-beta time
# ---------------------------------------------------------------------------------------

def traffic(algorithm, p, rank, count, itemsize, segment_bytes=DEFAULT_SEGMENT_BYTES):
    """(messages sent, bytes sent, messages received, bytes received) of ``rank`` for an
    all-reduce of ``count`` elements of ``itemsize`` bytes: what comm.meter must show.
    """
    nbytes = count * itemsize
    if p == 1:
        return 0, 0, 0, 0
    if algorithm in ("ring", "segmented_ring"):
        chunk = [n * itemsize for n in shard_sizes(count, p)]
        if algorithm == "ring":
            pieces = [1] * p
        else:
            per = max(1, segment_bytes // max(1, itemsize))
            pieces = [max(1, -(-n // per)) for n in shard_sizes(count, p)]
        sent = [c for c in range(p) if c != rank] + [c for c in range(p) if c != (rank + 1) % p]
        # reduce-scatter: sends every chunk's partial but its own, receives all but the left
        # neighbour's; all-gather: sends all but the right neighbour's, receives all but its own
        received = [c for c in range(p) if c != (rank - 1) % p] + [c for c in range(p) if c != rank]
        return (sum(pieces[c] for c in sent), sum(chunk[c] for c in sent),
                sum(pieces[c] for c in received), sum(chunk[c] for c in received))
    p2, rem = power_of_two_below(p), p - power_of_two_below(p)
    v = folded_rank(rank, p)
    if v is None:  # sends its array, receives the result
        return 1, nbytes, 1, nbytes
    fold = 1 if rank < 2 * rem else 0  # receives one array in the fold, sends one back
    rounds = p2.bit_length() - 1
    if algorithm == "recursive_doubling":
        return rounds + fold, (rounds + fold) * nbytes, rounds + fold, (rounds + fold) * nbytes
    if algorithm == "rabenseifner":
        chunk = [n * itemsize for n in shard_sizes(count, p2)]
        sent = received = 0
        lo, hi, mask = 0, p2, p2 // 2
        while mask >= 1:  # halving: send one half of [lo, hi), receive the other
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if v & mask == 0 else ((mid, hi), (lo, mid))
            sent += sum(chunk[give[0]:give[1]])
            received += sum(chunk[keep[0]:keep[1]])
            lo, hi = keep
            mask //= 2
        mask = 1
        while mask < p2:  # doubling: send what I own, receive what the partner owns
            other = (v ^ mask) & ~(mask - 1)
            sent += sum(chunk[lo:hi])
            received += sum(chunk[other:other + mask])
            lo, hi = min(lo, other), max(hi, other + mask)
            mask <<= 1
        return 2 * rounds + fold, sent + fold * nbytes, 2 * rounds + fold, received + fold * nbytes
    raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; expected one of {sorted(ALGORITHMS)}")


def predicted_seconds(algorithm, p, nbytes, alpha, beta, gamma=0.0, segment_bytes=DEFAULT_SEGMENT_BYTES):
    """Alpha-beta(-gamma) time of the algorithm's critical path for an N-byte all-reduce.

    alpha: seconds per message; beta: seconds per byte sent; gamma: seconds per byte added.
    Rounds in which every rank sends and receives at once count once. Folding (p not a
    power of two) adds two whole-array messages and one addition to the path.
    """
    if p == 1:
        return 0.0
    p2 = power_of_two_below(p)
    rounds = p2.bit_length() - 1
    fold = 0.0 if p == p2 else 2 * (alpha + nbytes * beta) + nbytes * gamma
    if algorithm == "ring":
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta + (p - 1) / p * nbytes * gamma
    if algorithm == "segmented_ring":
        # a pipeline: 2(p-1) stages, each segment one stage; the last segment leaves the
        # pipe after (stages + segments - 1) segment-times
        segment = min(segment_bytes, max(1, nbytes / p))
        pieces = max(1, -(-nbytes // (p * segment)))
        stage = alpha + segment * beta + segment * gamma / 2
        return (2 * (p - 1) + pieces - 1) * stage
    if algorithm == "recursive_doubling":
        return fold + rounds * (alpha + nbytes * beta + nbytes * gamma)
    if algorithm == "rabenseifner":
        return (fold + 2 * rounds * alpha + 2 * (p2 - 1) / p2 * nbytes * beta
                + (p2 - 1) / p2 * nbytes * gamma)
    raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; expected one of {sorted(ALGORITHMS)}")


# ---------------------------------------------------------------------------------------
# The selector
# ---------------------------------------------------------------------------------------

@lru_cache(maxsize=4)
def load_table(path=TABLE_PATH):
    """The measured selection table (a dict; see select_algorithm). Read once per path."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"no measured all-reduce table at {path}: run the commands in its docstring "
            "(python -m tp_from_scratch.bench algorithms --write-table ...) or pass table=")
    return json.loads(path.read_text())


def select_algorithm(table, backend, p, nbytes):
    """(algorithm name, keyword arguments) for an all-reduce of ``nbytes`` on ``p`` ranks.

    table["rules"][backend][str(p)] is a list of [largest nbytes, algorithm] rows in
    increasing order, the last row's bound being null (no limit), as measured by the
    benchmark. An unmeasured backend uses table["default_backend"]; an unmeasured p uses
    the nearest measured world size (the larger one on a tie): with p = 2, 3 and 4 measured,
    every p >= 5 takes p = 4's rules (the closest in rounds and, for 8, in being a power of two).
    """
    if p == 1:
        return "ring", {}
    rules = table["rules"].get(backend) or table["rules"][table["default_backend"]]
    measured = sorted(int(k) for k in rules)
    nearest = min(measured, key=lambda q: (abs(q - p), -q))
    for bound, name in rules[str(nearest)]:
        if bound is None or nbytes <= bound:
            break
    kwargs = {"segment_bytes": table["segment_bytes"]} if name == "segmented_ring" else {}
    return name, kwargs


def all_reduce(comm, x, op="sum", table=None):
    """All-reduce with the algorithm the measured table picks for this size, p and backend.

    Same contract as collectives.all_reduce. ``table``: a dict as written by the benchmark,
    or None for lessons/measurements/allreduce_algorithms.json. Every rank computes the same
    choice (it depends only on nbytes, p and the backend), so all enter the same algorithm.
    """
    x = np.asarray(x)
    table = load_table() if table is None else table
    name, kwargs = select_algorithm(table, type(comm).__name__, comm.world_size, x.nbytes)
    return ALGORITHMS[name](comm, x, op=op, **kwargs)
