"""The fixed-tree all-reduce on torch tensors, on either kind of group: the torch twin of tree.py.

    tree_all_reduce(group, leaves, n_leaves)    (n_leaves/t, ...) -> (...), the sum over all
                                                n_leaves leaves in the fixed tree order

``group`` decides, as everywhere in the course (nn/collectives.py):

* a ``Comm`` (simulated ranks, MPIComm, TorchComm): tree.tree_all_reduce on numpy, through
  the one torch <-> numpy bridge, metered by the communicator (calls, messages, bytes);
* a ``torch.distributed.ProcessGroup``: the same tree with ``dist.isend`` / ``dist.irecv``
  (point to point: a native ``dist.all_reduce`` chooses its own order, gloo's and nccl's
  algorithms alike, and that order changes with t), every wait bounded by TP_TIMEOUT.

Both give the same bits: the same leaves added in the same order. Half-precision sums:
bfloat16 has no numpy dtype and crosses the bridge as float32, so the tree adds bfloat16
leaves in float32 on both paths and rounds once at the end (NCCL does not: it sends bfloat16
partial sums and rounds after every addition, NVIDIA/nccl#1026); float16 adds in float16 on both (numpy's and torch's float16 additions round each sum the same way).
"""
from datetime import timedelta

import torch
import torch.distributed as dist

from tp_from_scratch.comm import Comm, timeout_from_env
from tp_from_scratch.nn.collectives import check_group, numpy_to_tensor, tensor_to_numpy, tp_rank, tp_world_size
from tp_from_scratch.numerics import tree

TREE_TAG = 13  # the tag of this module's point-to-point messages on a ProcessGroup


def accumulation_dtype(dtype):
    """The dtype the tree adds in: float32 for bfloat16 (one rounding at the end), else the dtype."""
    return torch.float32 if dtype == torch.bfloat16 else dtype


def tree_all_reduce(group, leaves, n_leaves=tree.DEFAULT_LEAVES):
    """leaves (n_leaves/t, ...): this rank's leaves -> a new tensor (...) holding the sum over all
    n_leaves leaves in the fixed binary-tree order, the same bits on every rank and for every t
    that divides n_leaves. forward only (not differentiable: the layers call it in their own
    backward). Cost per rank: log2 t messages of one leaf's bytes (tree.tree_traffic)."""
    if isinstance(check_group(group), Comm):
        return numpy_to_tensor(tree.tree_all_reduce(group, tensor_to_numpy(leaves), n_leaves), leaves)
    t, rank = tp_world_size(group), tp_rank(group)
    tree.check_shard(leaves, n_leaves, t, rank)
    partial = tree.local_tree_sum(leaves.detach().to(accumulation_dtype(leaves.dtype)))
    limit = timedelta(seconds=timeout_from_env())
    mask = 1
    while mask < t:  # recursive doubling: the tree's levels above the ranks' subtrees
        partner = dist.get_global_rank(group, rank ^ mask)
        theirs = torch.empty_like(partial)
        sent = dist.isend(partial.contiguous(), partner, group, tag=TREE_TAG)
        dist.irecv(theirs, partner, group, tag=TREE_TAG).wait(timeout=limit)
        sent.wait(timeout=limit)
        partial = partial + theirs if rank & mask == 0 else theirs + partial  # the lower rank's first
        mask <<= 1
    return partial.to(leaves.dtype)
