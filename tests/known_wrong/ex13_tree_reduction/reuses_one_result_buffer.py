"""Known wrong: the sum is written into one module-level workspace per shape and dtype, returned to the caller: a second call overwrites the first call's result."""
import numpy as np

_WORKSPACE = {}


def _check(comm, leaves, n_leaves):
    if n_leaves < 1 or n_leaves & (n_leaves - 1):
        raise ValueError(f"n_leaves={n_leaves} is not a power of two")
    t = comm.world_size
    if n_leaves % t:
        raise ValueError(f"tp={t} does not divide n_leaves={n_leaves}")
    if leaves.ndim == 0 or leaves.shape[0] != n_leaves // t:
        raise ValueError(f"expected {n_leaves // t} leaves on each rank, got shape {leaves.shape}")


def tree_all_reduce(comm, leaves, n_leaves=8):
    leaves = np.asarray(leaves)
    _check(comm, leaves, n_leaves)
    level = [leaves[i] for i in range(leaves.shape[0])]
    while len(level) > 1:
        level = [level[i] + level[i + 1] for i in range(0, len(level), 2)]
    partial = np.array(level[0], copy=True)
    mask = 1
    while mask < comm.world_size:
        partner = comm.rank ^ mask
        comm.send(partial, partner)
        theirs = comm.recv(partner)
        partial = partial + theirs if comm.rank & mask == 0 else theirs + partial
        mask <<= 1
    key = (comm.rank, partial.shape, partial.dtype.str)  # one workspace per rank, shape and dtype
    if key not in _WORKSPACE:
        _WORKSPACE[key] = np.empty_like(partial)
    out = _WORKSPACE[key]
    out[...] = partial
    return out


def invariant_row_parallel_matmul(comm, x_shard, w_shard, n_leaves=8):
    x_shard, w_shard = np.asarray(x_shard), np.asarray(w_shard)
    t = comm.world_size
    if n_leaves < 1 or n_leaves & (n_leaves - 1) or n_leaves % t:
        raise ValueError(f"tp={t} cannot serve n_leaves={n_leaves}")
    if x_shard.shape[1] != w_shard.shape[0]:
        raise ValueError(f"x_shard {x_shard.shape} and w_shard {w_shard.shape} do not multiply")
    here = n_leaves // t
    if x_shard.shape[1] % here:
        raise ValueError(f"K/t = {x_shard.shape[1]} is not a multiple of the {here} leaves of a rank")
    width = x_shard.shape[1] // here
    partials = np.stack([x_shard[:, j * width:(j + 1) * width] @ w_shard[j * width:(j + 1) * width]
                         for j in range(here)])
    return tree_all_reduce(comm, partials, n_leaves)
