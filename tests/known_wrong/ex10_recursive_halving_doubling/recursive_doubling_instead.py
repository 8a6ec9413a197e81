"""Known-wrong: recursive doubling (whole arrays swapped each round, with the fold). The sum
is right and the partners are the same, but every round moves the whole array: log2 p2
messages of N bytes instead of 2 log2 p2 messages shrinking from N/2."""
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
    mask = 1
    while mask < p2:
        comm.send(flat, real(v ^ mask))
        theirs = comm.recv(real(v ^ mask))
        flat = combine(flat, theirs) if not v & mask else combine(theirs, flat)
        mask *= 2
    if r < 2 * rem:
        comm.send(flat, r - 1)
    return flat.reshape(x.shape)
