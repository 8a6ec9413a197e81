"""The fixed binary-tree reduction: a sum over L leaves whose order does not depend on t.

Floating-point addition is not associative, so a sum split across t ranks comes out in other
bits when t changes: the row-parallel matmul adds t partial sums where one device adds one
long sum, and the ring all-reduce adds them in an order that depends on the rank (Lesson 2:
chunk c starts at rank c+1). The cure (TBIK, arXiv 2511.17826, abstract of v1: "align intra-
and inter-GPU reduction orders through a unified hierarchical binary tree structure") fixes the
order once, for every t:

    the reduced axis is cut into L leaves (L a power of two, 8 by default), and the sum
    over them is the complete binary tree over leaves 0 .. L-1:

        t = 1    rank 0:  ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))
        t = 2    rank 0:  (l0 + l1) + (l2 + l3)    rank 1:  (l4 + l5) + (l6 + l7)   then + across
        t = 4    rank r:  l(2r) + l(2r+1)          then recursive doubling: partners 1, 2 apart
        t = 8    rank r:  l(r)                     then recursive doubling: partners 1, 2, 4 apart

Rank r holds leaves [r L/t, (r+1) L/t): a whole subtree, which it sums in tree order
(``local_tree_sum``); the ranks then combine by Lesson 10's recursive doubling, whose round
k pairs rank v with v XOR 2^k and adds the lower rank's partial first: exactly the tree's
upper levels. Every t that divides L computes the same additions in the same order, so the
result has the same bits as t = 1; a t that does not divide L (3, 5, 6, 16 for L = 8) has no
subtree per rank and is refused by name (``check_leaves``).

Cost per rank: log2 t messages of the whole (reduced) array, N log2 t bytes: latency-optimal,
bandwidth log2 t / (2 (t-1)/t) times the ring's (1x at t = 2, 1.33x at t = 4, 1.71x at t = 8).
"""
import numpy as np

from tp_from_scratch.overlap.algorithms import all_reduce_recursive_doubling

DEFAULT_LEAVES = 8  # the largest t served: one node of 8 GPUs, where TP usually stays


def served(n_leaves):
    """The TP degrees a tree of ``n_leaves`` leaves serves: the powers of two up to n_leaves."""
    return [1 << k for k in range(int(n_leaves).bit_length()) if (1 << k) <= n_leaves]


def check_leaves(n_leaves, t):
    """Raise a ValueError unless every one of t ranks can hold a whole subtree of the fixed tree.

    n_leaves must be a power of two and t must divide it (so t is a power of two too).
    """
    if isinstance(n_leaves, bool) or not isinstance(n_leaves, (int, np.integer)) or n_leaves < 1 \
            or n_leaves & (n_leaves - 1):
        raise ValueError(f"the fixed reduction tree needs a power of two of leaves, got n_leaves={n_leaves!r}")
    if t < 1 or n_leaves % t:
        raise ValueError(f"tp={t} cannot serve the fixed reduction tree of {n_leaves} leaves: each rank "
                         f"must hold a whole subtree, so t must divide {n_leaves} "
                         f"(t = {', '.join(map(str, served(n_leaves)))})")


def local_tree_sum(leaves):
    """Sum the leaves along axis 0 in binary-tree order: (l0 + l1) + (l2 + l3), ... ; a new array.

    leaves: (n, ...) with n a power of two (numpy array or torch tensor). Each level adds
    neighbours, the left one first, so the result is the subtree's sum in the fixed order.
    """
    if leaves.shape[0] & (leaves.shape[0] - 1) or leaves.shape[0] == 0:
        raise ValueError(f"a subtree needs a power of two of leaves, got {leaves.shape[0]}")
    while leaves.shape[0] > 1:
        leaves = leaves[0::2] + leaves[1::2]  # (n/2, ...): level by level up the tree
    # one leaf: a copy, never the caller's own memory
    return leaves[0].clone() if hasattr(leaves, "clone") else np.array(leaves[0], copy=True)


def check_shard(leaves, n_leaves, t, rank):
    """Raise a ValueError unless ``leaves`` holds this rank's n_leaves / t leaves along axis 0."""
    check_leaves(n_leaves, t)
    if leaves.ndim == 0 or leaves.shape[0] != n_leaves // t:
        got = "a scalar" if leaves.ndim == 0 else f"{leaves.shape[0]} leaves (shape {tuple(leaves.shape)})"
        raise ValueError(f"rank {rank}: the tree of {n_leaves} leaves over tp={t} gives each rank "
                         f"{n_leaves // t} leaves along axis 0, got {got}")


def tree_all_reduce(comm, leaves, n_leaves=DEFAULT_LEAVES):
    """The sum over all ``n_leaves`` leaves in the fixed tree order, the same bits on every rank
    and for every t that divides n_leaves.

    leaves: (n_leaves/t, ...) this rank's leaves r n_leaves/t .. (r+1) n_leaves/t - 1 (numpy).
    Returns a new (...) array of the leaves' dtype; the input is not modified.
    Algorithm: the local subtree (``local_tree_sum``), then recursive doubling over the ranks
    (overlap.algorithms; t is a power of two, so nothing is folded).
    Cost per rank: log2 t messages of nbytes(leaf), sent and received (``tree_traffic``).
    """
    leaves = np.asarray(leaves)
    check_shard(leaves, n_leaves, comm.world_size, comm.rank)
    with comm.collective("tree_all_reduce", leaves, shape=leaves.shape, dtype=leaves.dtype, n_leaves=n_leaves):
        subtree = local_tree_sum(leaves)
        return all_reduce_recursive_doubling(comm, subtree)


def tree_traffic(t, leaf_nbytes):
    """(messages sent, bytes sent) per rank in tree_all_reduce; as many are received."""
    rounds = int(t).bit_length() - 1
    return rounds, rounds * leaf_nbytes


def leaf_partials(x_shard, w_shard, leaves_here):
    """(leaves_here, ..., N): x[..., leaf] @ w[leaf, :] for each of this rank's leaves of K.

    x_shard (..., K/t), w_shard (K/t, N). Each leaf is copied to a contiguous block first, so
    the matmul sees the same shapes and memory layout at every t: the same BLAS call, the same bits.
    """
    width = x_shard.shape[-1] // leaves_here
    return np.stack([np.ascontiguousarray(x_shard[..., j * width:(j + 1) * width])
                     @ np.ascontiguousarray(w_shard[j * width:(j + 1) * width]) for j in range(leaves_here)])


def invariant_row_parallel_matmul(comm, x_shard, w_shard, n_leaves=DEFAULT_LEAVES):
    """Y = X @ W from this rank's block of K, with the same bits at every t that divides n_leaves.

    x_shard (..., K/t) Sharded(-1), w_shard (K/t, N) (W (K, N), rows split like x's columns).
    Forward: one BLAS matmul per leaf of K/n_leaves columns (``leaf_partials``), then
    tree_all_reduce: Y (..., N), Replicated, a new array; the inputs are not modified.
    """
    x_shard, w_shard = np.asarray(x_shard), np.asarray(w_shard)
    t, rank = comm.world_size, comm.rank
    check_leaves(n_leaves, t)
    if x_shard.ndim < 1 or w_shard.ndim != 2 or x_shard.shape[-1] != w_shard.shape[0]:
        raise ValueError(f"rank {rank}: x_shard {x_shard.shape} and w_shard {w_shard.shape} do not "
                         f"multiply: x (..., K/t) @ w (K/t, N)")
    here = n_leaves // t
    if x_shard.shape[-1] % here:
        raise ValueError(f"rank {rank}: the shard's K/t = {x_shard.shape[-1]} columns do not cut into "
                         f"its {here} leaves of the tree of {n_leaves}")
    return tree_all_reduce(comm, leaf_partials(x_shard, w_shard, here), n_leaves)
