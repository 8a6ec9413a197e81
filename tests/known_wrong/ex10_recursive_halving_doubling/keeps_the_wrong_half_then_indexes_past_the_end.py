"""Known-wrong: while halving, the rank whose bit is 0 keeps the UPPER half; the doubling then
works from the range it owns, [lo, hi), and takes its partner's range as the one beside it
(above when its bit is 0). Having kept the wrong half, rank 0 looks for a chunk past the last
one: numpy's IndexError, which the graders must explain, not just show."""
import numpy as np

OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def all_reduce_rabenseifner(comm, x, op="sum"):
    x = np.asarray(x)
    combine = OPS[op]
    p, r = comm.world_size, comm.rank
    p2 = 1 << (p.bit_length() - 1)
    rem = p - p2
    flat = x.reshape(-1).copy()
    if r < 2 * rem and r % 2 == 0:
        comm.send(flat, r + 1)
        return comm.recv(r + 1).reshape(x.shape)
    if r < 2 * rem:
        flat = combine(comm.recv(r - 1), flat)
    v = r // 2 if r < 2 * rem else r - rem
    real = lambda u: 2 * u + 1 if u < rem else u + rem  # noqa: E731
    bounds = np.cumsum([0] + [c.size for c in np.array_split(flat, p2)])
    lo, hi, mask = 0, p2, p2 // 2
    while mask:
        mid = (lo + hi) // 2
        keep, give = ((mid, hi), (lo, mid)) if not v & mask else ((lo, mid), (mid, hi))  # swapped
        comm.send(flat[bounds[give[0]]:bounds[give[1]]], real(v ^ mask))
        theirs = comm.recv(real(v ^ mask))
        mine = flat[bounds[keep[0]]:bounds[keep[1]]]
        mine[...] = combine(mine, theirs)
        lo, hi = keep
        mask //= 2
    mask = 1
    while mask < p2:
        size = hi - lo
        other_lo, other_hi = (lo - size, lo) if v & mask else (hi, hi + size)
        comm.send(flat[bounds[lo]:bounds[hi]], real(v ^ mask))
        flat[bounds[other_lo]:bounds[other_hi]] = comm.recv(real(v ^ mask))
        lo, hi = min(lo, other_lo), max(hi, other_hi)
        mask *= 2
    if r < 2 * rem:
        comm.send(flat, r - 1)
    return flat.reshape(x.shape)
