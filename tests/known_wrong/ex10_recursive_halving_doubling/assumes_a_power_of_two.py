"""Known-wrong: no fold. Ranks pair with rank XOR mask and simply skip partners that do not
exist, so for p = 3, 5, 6, 7 some contributions never reach some ranks."""
import numpy as np

OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def all_reduce_rabenseifner(comm, x, op="sum"):
    x = np.asarray(x)
    combine = OPS[op]
    p, v = comm.world_size, comm.rank
    p2 = 1 << max(0, (p - 1).bit_length())  # rounds up: the missing ranks are skipped
    flat = x.reshape(-1).copy()
    bounds = np.cumsum([0] + [c.size for c in np.array_split(flat, p2)])
    lo, hi, mask = 0, p2, p2 // 2
    while mask:
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if not v & mask else ((mid, hi), (lo, mid))
        if v ^ mask < p:
            comm.send(flat[bounds[give[0]]:bounds[give[1]]], v ^ mask)
            mine = flat[bounds[keep[0]]:bounds[keep[1]]]
            mine[...] = combine(mine, comm.recv(v ^ mask))
        lo, hi = keep
        mask //= 2
    mask = 1
    while mask < p2:
        other = (v ^ mask) & ~(mask - 1)
        if v ^ mask < p:
            comm.send(flat[bounds[lo]:bounds[hi]], v ^ mask)
            flat[bounds[other]:bounds[other + mask]] = comm.recv(v ^ mask)
        lo, hi = min(lo, other), max(hi, other + mask)
        mask *= 2
    return flat.reshape(x.shape)
