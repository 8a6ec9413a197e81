"""Known-wrong: works on x.reshape(-1), a view of the caller's array, so the halving's
additions land in the caller's input, and the result returned is that same memory."""
import numpy as np

OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def all_reduce_rabenseifner(comm, x, op="sum"):
    x = np.asarray(x)
    combine = OPS[op]
    p, r = comm.world_size, comm.rank
    p2 = 1 << (p.bit_length() - 1)
    rem = p - p2
    flat = x.reshape(-1)  # a view: should be a copy
    if r < 2 * rem and r % 2 == 0:
        comm.send(flat, r + 1)
        flat[...] = comm.recv(r + 1)
        return x
    if r < 2 * rem:
        flat[...] = combine(comm.recv(r - 1), flat)
    v = r // 2 if r < 2 * rem else r - rem
    real = lambda u: 2 * u + 1 if u < rem else u + rem  # noqa: E731
    bounds = np.cumsum([0] + [c.size for c in np.array_split(flat, p2)])
    lo, hi, mask = 0, p2, p2 // 2
    while mask:
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if not v & mask else ((mid, hi), (lo, mid))
        comm.send(flat[bounds[give[0]]:bounds[give[1]]], real(v ^ mask))
        mine = flat[bounds[keep[0]]:bounds[keep[1]]]
        mine[...] = combine(mine, comm.recv(real(v ^ mask)))
        lo, hi = keep
        mask //= 2
    mask = 1
    while mask < p2:
        other = (v ^ mask) & ~(mask - 1)
        comm.send(flat[bounds[lo]:bounds[hi]], real(v ^ mask))
        flat[bounds[other]:bounds[other + mask]] = comm.recv(real(v ^ mask))
        lo, hi = min(lo, other), max(hi, other + mask)
        mask *= 2
    if r < 2 * rem:
        comm.send(flat, r - 1)
    return x
