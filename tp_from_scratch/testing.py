"""Test data shared by tests, graders, lessons and demos: rank-distinct random arrays.

Launching processes (torchrun, mpiexec) lives with the communicators, in
``tp_from_scratch.comm.launchers``.
"""
import numpy as np


def rank_rng(seed, rank=0):
    """A random generator that differs from rank to rank (and from seed to seed)."""
    return np.random.default_rng([seed, rank])


def random_array(rng, shape, dtype=np.float64, integer=False):
    """Standard-normal data, or small integers (-4..4) stored as floats when ``integer``.

    Integer-valued floats add exactly in any order, so results on them can be compared
    bit-exactly even where the parallel code sums in a different order.
    """
    if integer:
        return rng.integers(-4, 5, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)
