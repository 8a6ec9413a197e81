"""Megatron's region mappings f and g (and scatter / gather) as torch.autograd.Functions.

Megatron-LM (Shoeybi et al., 2019) describes tensor parallelism with two conjugate
operators around the "tensor-parallel region" (the part of a layer where each rank holds
a shard):

    f  = copy to the region:     forward identity,       backward all-reduce
    g  = reduce from the region: forward all-reduce,     backward identity
    scatter to the region:       forward split last dim, backward all-gather
    gather from the region:      forward all-gather,     backward split last dim

Each forward is the transpose (adjoint) of its backward: copying x to t ranks makes t
gradient contributions that must be summed; summing t partials hands every rank the
same gradient. Writing them as autograd Functions is all torch needs to differentiate
a tensor-parallel model. The numpy twins of Lesson 3 are
``tp_from_scratch.layers.mappings.f_forward(comm, x)`` / ``f_backward(comm, grad)`` and
``g_forward`` / ``g_backward``: the same names, the communicator first, as here.

The collectives they call (all_reduce, all_gather, split on a group) and the torch <-> numpy
bridge are tier 1, in nn/collectives.py; this file holds Megatron's tiers 2 and 3: the autograd
Functions and the wrappers a layer calls.

The group decides where the collectives come from
-------------------------------------------------
Every function and layer takes ``group`` first, and it is required:

* a ``torch.distributed.ProcessGroup`` (e.g. ``dist.group.WORLD``, or a mesh's TP group):
  PyTorch's native collectives;
* a ``tp_from_scratch.comm.Comm``: the from-scratch ring collectives of
  ``tp_from_scratch.collectives`` run on it (tensor -> numpy -> collective -> tensor). That is
  the SimulatedComm that run_spmd hands each in-process rank, or ``TorchComm(process_group)``
  over the same processes as a ProcessGroup, whose ``meter`` then counts every message.

Nothing else chooses: there is no default group and no switch.
"""
import torch
import torch.distributed as dist

from tp_from_scratch.comm import Comm
# tier 1, the collectives on a group (nn/collectives.py); importable from here too
from tp_from_scratch.nn.collectives import (all_gather, all_reduce, check_group, split,  # noqa: F401
                                            tp_rank, tp_world_size)
from tp_from_scratch.sharding import shard_sizes

# ---------------------------------------------------------------------------------------
# The region mappings
# ---------------------------------------------------------------------------------------

class CopyToTensorParallelRegion(torch.autograd.Function):
    """Megatron's f. forward: identity (x is already on every rank); backward: all-reduce."""

    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        # every rank used x in its own shard of the layer: the true gradient is the sum
        return None, all_reduce(ctx.group, grad)


class ReduceFromTensorParallelRegion(torch.autograd.Function):
    """Megatron's g. forward: all-reduce of the partial sums; backward: identity."""

    @staticmethod
    def forward(ctx, group, x):
        return all_reduce(group, x)

    @staticmethod
    def backward(ctx, grad):
        # y = sum_r x_r, so dy/dx_r = 1: every rank gets the (replicated) gradient unchanged
        return None, grad


class ReduceInPlaceFromTensorParallelRegion(torch.autograd.Function):
    """g on a temporary the caller gives up: forward all-reduces x in place (no copy, on a
    ProcessGroup; a Comm's collective makes a new array anyway); backward: identity."""

    @staticmethod
    def forward(ctx, group, x):
        if isinstance(group, Comm) or not x.is_contiguous():
            return all_reduce(group, x)
        dist.all_reduce(x, group=group)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return None, grad


class ScatterToTensorParallelRegion(torch.autograd.Function):
    """forward: keep this rank's chunk of the last dim; backward: all-gather the gradient chunks."""

    @staticmethod
    def forward(ctx, group, x, sizes=None):
        ctx.group = group
        ctx.sizes = sizes or shard_sizes(x.shape[-1], tp_world_size(group))
        return split(group, x, -1, ctx.sizes)

    @staticmethod
    def backward(ctx, grad):
        return None, all_gather(ctx.group, grad, -1, ctx.sizes), None


class GatherFromTensorParallelRegion(torch.autograd.Function):
    """forward: all-gather the chunks along the last dim; backward: keep this rank's gradient chunk."""

    @staticmethod
    def forward(ctx, group, x, sizes=None):
        ctx.group, ctx.sizes = group, sizes
        return all_gather(group, x, -1, sizes)

    @staticmethod
    def backward(ctx, grad):
        return None, split(ctx.group, grad, -1, ctx.sizes), None


class SumOverReplicas(torch.autograd.Function):
    """forward: identity on a tensor that ``replicas`` neighbouring ranks hold identical copies of;
    backward: each copy's gradient becomes the sum over the copies (an all-reduce among them).

    Used for the weights of a KV head shared by t/nkv ranks (nkv < t): each rank's copy only
    sees the gradient of its own query heads, and the true gradient is their sum. The sum is
    one all-reduce over the whole group of a buffer with a slot per distinct piece (every
    rank writes its gradient into its piece's slot), so it needs no sub-group and runs on a
    ProcessGroup and a Comm alike; it moves t/r times the bytes of an all-reduce among the
    r sharers alone.
    """

    @staticmethod
    def forward(ctx, group, replicas, w):
        ctx.group, ctx.replicas = group, replicas
        return w.view_as(w)

    @staticmethod
    def backward(ctx, grad):
        t, rank = tp_world_size(ctx.group), tp_rank(ctx.group)
        slots = grad.new_zeros((t // ctx.replicas,) + tuple(grad.shape))  # (t/r, *w.shape)
        slots[rank // ctx.replicas] = grad
        return None, None, all_reduce(ctx.group, slots)[rank // ctx.replicas]


def sum_over_replicas(group, w, replicas):
    """``w`` unchanged; in backward its gradient is summed over the ``replicas`` ranks holding it."""
    if replicas == 1:
        return w
    return SumOverReplicas.apply(check_group(group), replicas, w)


def copy_to_tp_region(group, x):
    """f: x unchanged; its gradient is all-reduced over ``group`` in backward."""
    return CopyToTensorParallelRegion.apply(check_group(group), x)


def reduce_from_tp_region(group, x):
    """g: the sum of every rank's x (all-reduce); the gradient passes through unchanged."""
    return ReduceFromTensorParallelRegion.apply(check_group(group), x)


def reduce_from_tp_region_(group, x):
    """g written into ``x`` itself: for a partial sum the caller never reads again (a row-parallel
    matmul's output), it saves reduce_from_tp_region's copy of (B, T, H) per call. Returns x,
    now the sum; the gradient passes through unchanged."""
    return ReduceInPlaceFromTensorParallelRegion.apply(check_group(group), x)


def scatter_to_tp_region(group, x, sizes=None):
    """(..., n) -> (..., n_r), this rank's chunk; backward all-gathers the gradient."""
    return ScatterToTensorParallelRegion.apply(check_group(group), x, sizes)


def gather_from_tp_region(group, x, sizes=None):
    """(..., n_r) -> (..., n), every rank's chunk in rank order; backward keeps this rank's chunk."""
    return GatherFromTensorParallelRegion.apply(check_group(group), x, sizes)


# The paper's short names, as on the numpy side (layers.mappings.f_forward / g_forward)
f = copy_to_tp_region
g = reduce_from_tp_region

__all__ = ["check_group", "tp_rank", "tp_world_size", "all_reduce", "all_gather", "split",
           "CopyToTensorParallelRegion", "ReduceFromTensorParallelRegion", "ReduceInPlaceFromTensorParallelRegion",
           "ScatterToTensorParallelRegion", "GatherFromTensorParallelRegion", "SumOverReplicas",
           "sum_over_replicas", "copy_to_tp_region", "reduce_from_tp_region", "reduce_from_tp_region_",
           "scatter_to_tp_region",
           "gather_from_tp_region", "f", "g"]
