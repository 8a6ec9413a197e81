"""Known-wrong: reduce-scatter adds in place into numpy.array_split's chunks, which are views of x.

The results are right, but the caller's array is silently overwritten.
"""
import numpy as np


def reduce_scatter(comm, x, axis=0, op="sum"):
    p, r = comm.world_size, comm.rank
    chunks = np.array_split(x, p, axis=axis)  # views into x, not copies
    for step in range(p - 1):
        comm.send(chunks[(r - step - 1) % p].copy(), (r + 1) % p)
        i = (r - step - 2) % p
        received = comm.recv((r - 1) % p)
        if op == "sum":
            chunks[i] += received  # writes into the caller's x
        else:
            np.maximum(chunks[i], received, out=chunks[i])
    return chunks[r].copy()


def all_gather(comm, x, axis=0):
    p, r = comm.world_size, comm.rank
    shards = [None] * p
    shards[r] = x
    for step in range(p - 1):
        comm.send(shards[(r - step) % p], (r + 1) % p)
        shards[(r - step - 1) % p] = comm.recv((r - 1) % p)
    return np.concatenate(shards, axis=axis)


def all_reduce(comm, x, op="sum"):
    mine = reduce_scatter(comm, x.reshape(-1), 0, op)
    return all_gather(comm, mine, 0).reshape(x.shape)
