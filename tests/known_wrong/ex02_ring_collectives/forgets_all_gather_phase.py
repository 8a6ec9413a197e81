"""Known-wrong: all_reduce stops after the reduce-scatter.

Each rank writes its fully reduced chunk back into its own copy of x, so only 1/p of
the result is right; the other chunks still hold this rank's partial data.
"""
import numpy as np

from tp_from_scratch.collectives import all_gather, reduce_scatter  # noqa: F401


def all_reduce(comm, x, op="sum"):
    p, r = comm.world_size, comm.rank
    flat = x.reshape(-1).copy()
    mine = reduce_scatter(comm, flat, 0, op)
    start = sum(c.size for c in np.array_split(flat, p)[:r])
    flat[start:start + mine.size] = mine
    return flat.reshape(x.shape)
