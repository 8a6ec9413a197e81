"""Exercise 2: ring collectives written on send and recv only (lessons/02_collectives.ipynb).

Replace each `raise NotImplementedError(...)` with your code, then run
    make grade            (or: .venv/bin/python -m pytest exercises -m ex02 -x)
The graders run your functions on the simulator (tp_from_scratch.comm.run_spmd), on world
sizes that are not powers of two and arrays whose length p does not divide.

You may use only:
    comm.rank, comm.world_size      who am I, how many are we
    comm.send(array, dst)           hand a numpy array to rank dst (does not wait for dst)
    comm.recv(src) -> array         wait for the next array from rank src
and numpy. The ring: rank r sends to (r + 1) % p and receives from (r - 1) % p.
The graders also read comm.meter: each rank must send about (p-1)/p of the array in
reduce_scatter and all_gather, and 2(p-1)/p in all_reduce, and talk only to its neighbours.
Every collective returns a NEW array, also when p = 1 (never x itself or a view of it),
never modifies x, and keeps x's dtype (the graders use float64, float32 and int64).
"""
import numpy as np  # noqa: F401 (yours to use)


def reduce_scatter(comm, x, axis=0, op="sum"):
    """Reduce x over all ranks, and return this rank's chunk of the result.

    The chunks are those of numpy.array_split(x, p, axis): rank r gets chunk r, which may
    be empty when x is shorter than p. op is "sum" or "max". x is never modified.
    Ring: p - 1 steps; in each, send one partially reduced chunk to the next rank and
    add (or max) the chunk received from the previous one into your own running copy.
    """
    raise NotImplementedError("Exercise 2 (reduce_scatter): see lessons/02_collectives.ipynb")


def all_gather(comm, x, axis=0):
    """Concatenate every rank's x along axis, in rank order; every rank gets the whole result.

    Shards may have different lengths along axis (but agree on every other dimension).
    The result has x's dtype.
    Ring: p - 1 steps; in each, pass on the shard you received in the previous step.
    """
    raise NotImplementedError("Exercise 2 (all_gather): see lessons/02_collectives.ipynb")


def all_reduce(comm, x, op="sum"):
    """Reduce x over all ranks (elementwise sum or max); every rank gets the full result.

    The result has x's shape and dtype. Bandwidth-optimal ring: a reduce-scatter of the
    flattened array, then an all-gather of the reduced chunks, so each rank sends
    2(p-1)/p of the array instead of (p-1) times all of it.
    """
    raise NotImplementedError("Exercise 2 (all_reduce): see lessons/02_collectives.ipynb")
