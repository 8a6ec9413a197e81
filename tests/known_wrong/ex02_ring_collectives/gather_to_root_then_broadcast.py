"""Known-wrong (in cost, not in value): rank 0 collects every array, reduces, sends the result back.

The answers are right, but rank 0 sends and receives (p-1) whole arrays instead of
2(p-1)/p of one: it fails the meter's cost check and the ring-topology check.
"""
import numpy as np

_OPS = {"sum": np.add, "max": np.maximum}


def all_reduce(comm, x, op="sum"):
    p, r = comm.world_size, comm.rank
    if r != 0:
        comm.send(x, 0)
        return comm.recv(0)
    total = x.copy()
    for src in range(1, p):
        total = _OPS[op](total, comm.recv(src))
    for dst in range(1, p):
        comm.send(total, dst)
    return total


def reduce_scatter(comm, x, axis=0, op="sum"):
    return np.array_split(all_reduce(comm, x, op), comm.world_size, axis=axis)[comm.rank].copy()


def all_gather(comm, x, axis=0):
    p, r = comm.world_size, comm.rank
    if r != 0:
        comm.send(x, 0)
        return comm.recv(0)
    whole = np.concatenate([x] + [comm.recv(src) for src in range(1, p)], axis=axis)
    for dst in range(1, p):
        comm.send(whole, dst)
    return whole
