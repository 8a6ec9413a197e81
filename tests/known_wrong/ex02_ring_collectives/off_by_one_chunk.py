"""Known-wrong: the reduce-scatter sends chunk r - step instead of r - step - 1.

Each rank then adds into a chunk its neighbour has not finished with, and ends up
returning a chunk that is missing one rank's contribution (or has one twice).
"""
import numpy as np

from tp_from_scratch.collectives import all_gather  # noqa: F401


def reduce_scatter(comm, x, axis=0, op="sum"):
    p, r = comm.world_size, comm.rank
    reduce = np.add if op == "sum" else np.maximum
    chunks = [c.copy() for c in np.array_split(x, p, axis=axis)]
    for step in range(p - 1):
        comm.send(chunks[(r - step) % p], (r + 1) % p)  # off by one: should be r - step - 1
        i = (r - step - 1) % p
        chunks[i] = reduce(chunks[i], comm.recv((r - 1) % p))
    return chunks[r]


def all_reduce(comm, x, op="sum"):
    mine = reduce_scatter(comm, x.reshape(-1), 0, op)
    return all_gather(comm, mine, 0).reshape(x.shape)
