"""Known-wrong: every rank sends to its right neighbour but also waits on its right neighbour.

Nobody ever receives from the left, so on 3 or more ranks the ring deadlocks: the
simulator must report who waits on whom instead of hanging.
"""
import numpy as np

_OPS = {"sum": np.add, "max": np.maximum}


def reduce_scatter(comm, x, axis=0, op="sum"):
    p, r = comm.world_size, comm.rank
    chunks = [c.copy() for c in np.array_split(x, p, axis=axis)]
    for step in range(p - 1):
        comm.send(chunks[(r - step - 1) % p], (r + 1) % p)
        i = (r - step - 2) % p
        chunks[i] = _OPS[op](chunks[i], comm.recv((r + 1) % p))  # should be (r - 1) % p
    return chunks[r]


def all_gather(comm, x, axis=0):
    p, r = comm.world_size, comm.rank
    shards = [None] * p
    shards[r] = x.copy()
    for step in range(p - 1):
        comm.send(shards[(r - step) % p], (r + 1) % p)
        shards[(r - step - 1) % p] = comm.recv((r + 1) % p)  # should be (r - 1) % p
    return np.concatenate(shards, axis=axis)


def all_reduce(comm, x, op="sum"):
    mine = reduce_scatter(comm, x.reshape(-1), 0, op)
    return all_gather(comm, mine, 0).reshape(x.shape)
