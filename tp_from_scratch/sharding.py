"""Cutting a full (single-device) array into per-device shards, and gluing them back.

Notation used across the course: a weight W[H, F_t] has its F axis sharded over the
t tensor-parallel ranks; rank i holds the i-th contiguous block.
"""
import numpy as np


def check_divisible(size, world_size, what):
    """Raise a ValueError naming the quantity when ``world_size`` does not divide ``size``."""
    if world_size < 1:
        raise ValueError(f"tp degree must be at least 1, got {world_size}")
    if size % world_size != 0:
        raise ValueError(f"{what} {size} is not divisible by tp={world_size}")


def shard_sizes(size, world_size):
    """Sizes of an uneven split, numpy.array_split style: the first ``size % world_size`` get one more."""
    base, extra = divmod(size, world_size)
    return [base + (1 if i < extra else 0) for i in range(world_size)]


def shard_range(size, rank, world_size):
    """(start, stop) of ``rank``'s contiguous block of ``size`` items, split as by :func:`shard_sizes`."""
    sizes = shard_sizes(size, world_size)
    start = sum(sizes[:rank])
    return start, start + sizes[rank]


def shard(array, world_size, axis, *, even=True):
    """Split ``array`` into ``world_size`` contiguous shards along ``axis``.

    even=True (the default) demands equal shards and raises a ValueError naming the
    axis, its size and the world size otherwise; even=False splits like numpy.array_split.
    Shards are copies, so a device may modify its own without touching the others.
    """
    array = np.asarray(array)
    axis = axis % array.ndim
    if even:
        check_divisible(array.shape[axis], world_size, f"dimension {axis} of size")
    elif world_size < 1:
        raise ValueError(f"tp degree must be at least 1, got {world_size}")
    return [s.copy() for s in np.array_split(array, world_size, axis=axis)]


def unshard(shards, axis):
    """Concatenate shards along ``axis`` in rank order: the inverse of :func:`shard`."""
    return np.concatenate(list(shards), axis=axis)
