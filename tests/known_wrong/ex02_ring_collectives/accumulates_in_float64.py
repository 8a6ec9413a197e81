"""Known-wrong: the ring accumulates in float64 "for accuracy" and returns float64 for float32 input.

A collective must keep the caller's dtype: a float32 model would silently double its memory.
"""
import numpy as np

from tp_from_scratch.collectives import all_gather  # noqa: F401

_OPS = {"sum": np.add, "max": np.maximum}


def reduce_scatter(comm, x, axis=0, op="sum"):
    p, r = comm.world_size, comm.rank
    chunks = [c.astype(np.float64) for c in np.array_split(x, p, axis=axis)]
    for step in range(p - 1):
        comm.send(chunks[(r - step - 1) % p], (r + 1) % p)
        i = (r - step - 2) % p
        chunks[i] = _OPS[op](chunks[i], comm.recv((r - 1) % p))
    return chunks[r]


def all_reduce(comm, x, op="sum"):
    mine = reduce_scatter(comm, x.reshape(-1), 0, op)
    return all_gather(comm, mine, 0).reshape(x.shape)
