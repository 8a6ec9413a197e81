"""Known wrong: the sum is written into one module-level workspace per shape and dtype, returned to the caller: a second call overwrites the first call's result.

Everything else is the reference's (numerics.tree), so only the reused buffer can fail a grader."""
import numpy as np

from tp_from_scratch.numerics import tree

_WORKSPACE = {}


def _into_workspace(comm, result):
    key = (comm.rank, result.shape, result.dtype.str)  # one workspace per rank, shape and dtype
    if key not in _WORKSPACE:
        _WORKSPACE[key] = np.empty_like(result)
    out = _WORKSPACE[key]
    out[...] = result
    return out


def tree_all_reduce(comm, leaves, n_leaves=8):
    return _into_workspace(comm, tree.tree_all_reduce(comm, leaves, n_leaves))


def invariant_row_parallel_matmul(comm, x_shard, w_shard, n_leaves=8):
    return _into_workspace(comm, tree.invariant_row_parallel_matmul(comm, x_shard, w_shard, n_leaves))
