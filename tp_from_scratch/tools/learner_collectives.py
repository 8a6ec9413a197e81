"""Run Exercises 3-6 on the learner's own ring collectives (Exercise 2) instead of the library's.

    TP_COLLECTIVES=mine .venv/bin/python -m pytest exercises -m ex03      # or: make grade COLLECTIVES=mine

The exercise graders call this from exercises/conftest.py before any test module is
imported. It replaces reduce_scatter, all_gather and all_reduce in
tp_from_scratch.collectives (the functions every numpy layer and, for a simulated group,
every torch mapping calls) with the learner's, each wrapped in ``comm.collective`` so the
meter still counts one call per collective and the simulator still checks that the ranks
agree. This changes a module for the rest of the process: it is meant for a grading
process only, never for the library's own tests.
"""
import functools
import os

import numpy as np

from tp_from_scratch.tools.grading import load_implementation

NAMES = ("reduce_scatter", "all_gather", "all_reduce")


def _metered(name, fn):
    """fn(comm, x, ...) announced to the communicator as the collective ``name``."""
    @functools.wraps(fn)
    def collective(comm, x, *args, **kwargs):
        x = np.asarray(x)
        params = {"dtype": x.dtype}
        if name == "all_reduce":
            params.update(shape=x.shape, op=kwargs.get("op", args[0] if args else "sum"))
        else:
            axis = kwargs.get("axis", args[0] if args else 0) % max(x.ndim, 1)
            shape = x.shape if name == "reduce_scatter" else tuple(
                "*" if i == axis else n for i, n in enumerate(x.shape))  # all_gather: lengths may differ
            params.update(shape=shape, axis=axis)
        with comm.collective(name, x, **params):
            return fn(comm, x, *args, **kwargs)
    collective.learners = fn
    return collective


def install(impl=None):
    """Replace the library's ring collectives with the learner's Exercise 2 (from TP_IMPL's place).

    impl: where to find ex02_ring_collectives.py, as TP_IMPL says ("" for exercises/); with
    TP_IMPL=reference the learner's exercises/ are used (grading the library on itself
    would prove nothing new).
    """
    from tp_from_scratch import collectives

    impl = os.environ.get("TP_IMPL", "") if impl is None else impl
    mine = load_implementation("ex02", "" if impl == "reference" else impl)
    for name in NAMES:
        setattr(collectives, name, _metered(name, getattr(mine, name)))
    return mine
