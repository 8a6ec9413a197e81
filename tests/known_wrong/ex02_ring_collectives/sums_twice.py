"""Known-wrong: the all-gather phase of all_reduce adds the received chunk instead of storing it.

The reduced chunks arrive on top of the rank's own partial data, so every chunk but the
rank's own is counted twice for that rank's contribution.
"""
import numpy as np

from tp_from_scratch.collectives import all_gather, reduce_scatter  # noqa: F401


def all_reduce(comm, x, op="sum"):
    p, r = comm.world_size, comm.rank
    chunks = [c.copy() for c in np.array_split(x.reshape(-1), p)]
    chunks[r] = reduce_scatter(comm, x.reshape(-1), 0, op)
    for step in range(p - 1):
        comm.send(chunks[(r - step) % p], (r + 1) % p)
        i = (r - step - 1) % p
        chunks[i] = chunks[i] + comm.recv((r - 1) % p)  # should be: chunks[i] = comm.recv(...)
    return np.concatenate(chunks).reshape(x.shape)
