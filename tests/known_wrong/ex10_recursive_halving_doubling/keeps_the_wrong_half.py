"""Known-wrong: while halving, the rank whose bit is 0 keeps the UPPER half.

The reduce-scatter still adds every chunk once, but rank v ends owning the sum of a chunk
other than chunk v, and the doubling phase (which assumes v owns chunk v) sends the wrong
pieces to the wrong places: most of the result stays this rank's partial data.
"""
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
        other = (v ^ mask) & ~(mask - 1)
        comm.send(flat[bounds[v & ~(mask - 1)]:bounds[(v & ~(mask - 1)) + mask]], real(v ^ mask))
        flat[bounds[other]:bounds[other + mask]] = comm.recv(real(v ^ mask))
        mask *= 2
    if r < 2 * rem:
        comm.send(flat, r - 1)
    return flat.reshape(x.shape)
