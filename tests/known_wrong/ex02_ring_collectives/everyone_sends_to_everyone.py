"""Known-wrong (in cost): every rank sends its whole array to every other rank and sums locally.

Correct values, but each rank sends (p-1) whole arrays, far more than 2(p-1)/p of one,
and it talks to every rank rather than to its ring neighbours.
"""
import numpy as np

_OPS = {"sum": np.add, "max": np.maximum}


def all_reduce(comm, x, op="sum"):
    p, r = comm.world_size, comm.rank
    for dst in range(p):
        if dst != r:
            comm.send(x, dst)
    parts = [x if src == r else comm.recv(src) for src in range(p)]
    total = parts[0].copy()
    for part in parts[1:]:
        total = _OPS[op](total, part)
    return total


def reduce_scatter(comm, x, axis=0, op="sum"):
    # direct: send chunk i straight to rank i; the right bytes, the wrong topology
    p, r = comm.world_size, comm.rank
    chunks = np.array_split(x, p, axis=axis)
    for dst in range(p):
        if dst != r:
            comm.send(chunks[dst].copy(), dst)
    mine = chunks[r].copy()
    for src in range(p):
        if src != r:
            mine = _OPS[op](mine, comm.recv(src))
    return mine


def all_gather(comm, x, axis=0):
    p, r = comm.world_size, comm.rank
    for dst in range(p):
        if dst != r:
            comm.send(x, dst)
    return np.concatenate([x if src == r else comm.recv(src) for src in range(p)], axis=axis)
