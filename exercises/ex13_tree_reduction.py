"""Exercise 13: the fixed binary-tree all-reduce and a row-parallel matmul with the same bits at
every t (lessons/13_tp_numerics.ipynb).

Replace the `raise NotImplementedError(...)` with your code, then run
    make grade            (or: .venv/bin/python -m pytest exercises -m ex13 -x)
The graders run your functions on the simulator (tp_from_scratch.comm.run_spmd) for t = 1, 2, 4
and 8 and compare every result BIT FOR BIT: with the tree they write out themselves, with your
own result at the other t, and across the ranks. Gaussian data: a sum in any other order shows.

You may use only:
    comm.rank, comm.world_size      who am I, how many are we (t)
    comm.send(array, dst)           hand a numpy array to rank dst (does not wait for dst)
    comm.recv(src) -> array         wait for the next array from rank src
and numpy. The tree over n_leaves leaves l0 .. l(L-1) (L a power of two, 8 by default) is

    ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))

Rank r holds the L/t leaves r L/t .. (r+1) L/t - 1: a whole subtree when t divides L.
  1. sum your leaves level by level: neighbours 0+1, 2+3, ... (the left one first), then the
     pairs of those, until one array is left;
  2. then recursive doubling: for mask = 1, 2, 4, ..., t/2 swap your partial sum with rank
     rank ^ mask and add, the lower rank's partial on the left. That is the tree's upper levels.
Per rank that sends log2 t messages, each of one leaf's size, to ranks rank ^ 1, rank ^ 2, ...
(the graders read comm.meter and who you talk to).
"""


def tree_all_reduce(comm, leaves, n_leaves=8):
    """The sum over all n_leaves leaves in the fixed tree order, on every rank.

    leaves: numpy array (n_leaves // t, ...) of this rank's leaves, any float or int dtype, any
    leaf shape (0-d and empty too). Returns a new array of the leaf shape and dtype (at t = 1
    with one leaf too: a copy, never a view of leaves); leaves is never modified.
    Raises ValueError before any message, on every rank, when
      * n_leaves is not a power of two (the message names n_leaves),
      * t does not divide n_leaves (the message contains "tp=<t>", e.g. "tp=3"),
      * leaves.shape[0] is not n_leaves // t (the message names the leaves).
    """
    raise NotImplementedError("Exercise 13 (tree_all_reduce): see lessons/13_tp_numerics.ipynb")


def invariant_row_parallel_matmul(comm, x_shard, w_shard, n_leaves=8):
    """Y = X @ W from this rank's block of K, with the same bits at every t that divides n_leaves.

    x_shard (M, K/t): this rank's columns of X; w_shard (K/t, N): the same rows of W; float32 or
    float64. Cut the shard's K/t columns into its n_leaves // t leaves of equal width; each
    leaf's partial product is x_shard[:, leaf] @ w_shard[leaf, :] (one numpy matmul per leaf);
    then tree_all_reduce adds the partials. Returns a new (M, N) array; the inputs are not
    modified. Raises ValueError (before any message) for what tree_all_reduce refuses, when
    K/t is not a multiple of n_leaves // t, and when the shapes do not multiply.
    """
    raise NotImplementedError("Exercise 13 (invariant_row_parallel_matmul): see lessons/13_tp_numerics.ipynb")
