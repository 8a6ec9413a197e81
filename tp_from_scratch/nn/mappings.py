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
a tensor-parallel model.

Where the collectives come from: the ``group`` argument
-------------------------------------------------------
* ``None``: the default torch.distributed process group;
* a ``torch.distributed.ProcessGroup``;
* a ``tp_from_scratch.comm.Comm`` (e.g. the SimulatedComm that run_spmd hands each
  in-process rank, or a TorchComm you built): the from-scratch ring collectives of
  ``tp_from_scratch.collectives`` run on it (tensor -> numpy -> collective -> tensor).

For process groups, ONE switch in this module (the only configuration in tp_from_scratch.nn)
chooses between PyTorch's native collectives ("native", the default) and the from-scratch
ones run over ``TorchComm(group)`` ("scratch")::

    set_collective_impl("scratch")          # from now on
    with collective_impl("scratch"): ...    # for a block, restored afterwards

Both give the same results (tests/test_nn_torchrun.py checks it).
"""
import contextlib

import numpy as np
import torch
import torch.distributed as dist

from tp_from_scratch.sharding import shard_sizes

IMPLEMENTATIONS = ("native", "scratch")
_collective_impl = "native"  # the one switch; see the module docstring
_scratch_comms = {}          # process group -> its TorchComm, so its meter accumulates


def set_collective_impl(name):
    """Route process-group collectives through "native" torch.distributed or "scratch" ones."""
    global _collective_impl
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"collective implementation {name!r} is not one of {IMPLEMENTATIONS}")
    _collective_impl = name


def get_collective_impl():
    """The current switch setting: "native" or "scratch"."""
    return _collective_impl


@contextlib.contextmanager
def collective_impl(name):
    """``with collective_impl("scratch"):`` sets the switch for the block and restores it after."""
    before = _collective_impl
    set_collective_impl(name)
    try:
        yield
    finally:
        set_collective_impl(before)


# ---------------------------------------------------------------------------------------
# The group: rank, size, and which backend carries its collectives
# ---------------------------------------------------------------------------------------

def is_comm(group):
    """True if ``group`` is a tp_from_scratch Comm (collectives from scratch on send/recv)."""
    if group is None or isinstance(group, dist.ProcessGroup):
        return False
    from tp_from_scratch.comm import Comm  # imported only when someone hands us a Comm
    return isinstance(group, Comm)


def tp_rank(group=None):
    """This rank's index inside the tensor-parallel group."""
    return group.rank if is_comm(group) else dist.get_rank(group)


def tp_world_size(group=None):
    """The tensor-parallel degree t: the number of ranks in the group."""
    return group.world_size if is_comm(group) else dist.get_world_size(group)


def scratch_comm(group=None, device=None):
    """The TorchComm that carries "scratch" collectives for a process group (one per group).

    Kept per group so that ``scratch_comm(group).meter`` adds up a whole run's traffic.
    """
    from tp_from_scratch.comm import TorchComm
    key = (group, None if device is None else str(device))
    if key not in _scratch_comms:
        _scratch_comms[key] = TorchComm(group, device=device)
    return _scratch_comms[key]


def _comm_for(group, x):
    """The Comm to run from-scratch collectives on, or None for native torch.distributed."""
    if is_comm(group):
        return group
    if _collective_impl == "scratch":
        return scratch_comm(group, x.device if x.is_cuda else None)
    return None


def _to_numpy(x):
    # bfloat16 has no numpy type: it travels as float32 and comes back rounded
    t = x.detach()
    return (t.float() if t.dtype == torch.bfloat16 else t).cpu().numpy()


def _from_numpy(a, like):
    return torch.from_numpy(np.ascontiguousarray(a)).to(device=like.device, dtype=like.dtype)


# ---------------------------------------------------------------------------------------
# The three collectives the mappings need, on every backend. Inputs are never modified.
# ---------------------------------------------------------------------------------------

def all_reduce(x, group=None, op="sum"):
    """A new tensor holding the element-wise sum (or max) of ``x`` over the ranks of ``group``."""
    comm = _comm_for(group, x)
    if comm is not None:
        from tp_from_scratch import collectives
        return _from_numpy(collectives.all_reduce(comm, _to_numpy(x), op=op), x)
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
    if op not in ops:
        raise ValueError(f"all_reduce op {op!r} is not one of {sorted(ops)}")
    y = x.detach().clone().contiguous()  # torch reduces in place; the caller keeps x
    dist.all_reduce(y, op=ops[op], group=group)
    return y


def all_gather_last_dim(x, group=None, sizes=None):
    """Concatenate every rank's ``x`` along the last dim, in rank order: (..., n_r) -> (..., sum n_r).

    sizes: each rank's last-dim size when they differ (an uneven split); None means equal.
    """
    comm = _comm_for(group, x)
    if comm is not None:
        from tp_from_scratch import collectives
        return _from_numpy(collectives.all_gather(comm, _to_numpy(x), axis=-1), x)
    t = dist.get_world_size(group)
    sizes = sizes or [x.shape[-1]] * t
    # native all_gather needs equal shapes: pad every shard to the largest, trim afterwards
    pad = max(sizes) - x.shape[-1]
    padded = torch.nn.functional.pad(x.detach(), (0, pad)).contiguous()
    pieces = [torch.empty_like(padded) for _ in range(t)]
    dist.all_gather(pieces, padded, group=group)
    return torch.cat([p[..., :n] for p, n in zip(pieces, sizes)], dim=-1)


def split_last_dim(x, group=None, sizes=None):
    """This rank's contiguous chunk of the last dim: (..., n) -> (..., n_r), no communication.

    sizes: the chunk sizes; None splits like numpy.array_split (the first n % t get one more).
    """
    t, rank = tp_world_size(group), tp_rank(group)
    sizes = sizes or shard_sizes(x.shape[-1], t)
    if len(sizes) != t:
        raise ValueError(f"rank {rank}: {len(sizes)} shard sizes {sizes} for tp={t} ranks")
    if sum(sizes) != x.shape[-1]:
        raise ValueError(f"rank {rank}: last dimension of size {x.shape[-1]} does not match the shard "
                         f"sizes {sizes} (they add up to {sum(sizes)})")
    start = sum(sizes[:rank])
    return x[..., start:start + sizes[rank]].contiguous()


# ---------------------------------------------------------------------------------------
# The region mappings
# ---------------------------------------------------------------------------------------

class CopyToTensorParallelRegion(torch.autograd.Function):
    """Megatron's f. forward: identity (x is already on every rank); backward: all-reduce."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        # every rank used x in its own shard of the layer: the true gradient is the sum
        return all_reduce(grad, ctx.group), None


class ReduceFromTensorParallelRegion(torch.autograd.Function):
    """Megatron's g. forward: all-reduce of the partial sums; backward: identity."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        # y = sum_r x_r, so dy/dx_r = 1: every rank gets the (replicated) gradient unchanged
        return grad, None


class ScatterToTensorParallelRegion(torch.autograd.Function):
    """forward: keep this rank's chunk of the last dim; backward: all-gather the gradient chunks."""

    @staticmethod
    def forward(ctx, x, group, sizes=None):
        ctx.group = group
        ctx.sizes = sizes or shard_sizes(x.shape[-1], tp_world_size(group))
        return split_last_dim(x, group, ctx.sizes)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_last_dim(grad, ctx.group, ctx.sizes), None, None


class GatherFromTensorParallelRegion(torch.autograd.Function):
    """forward: all-gather the chunks along the last dim; backward: keep this rank's gradient chunk."""

    @staticmethod
    def forward(ctx, x, group, sizes=None):
        ctx.group, ctx.sizes = group, sizes
        return all_gather_last_dim(x, group, sizes)

    @staticmethod
    def backward(ctx, grad):
        return split_last_dim(grad, ctx.group, ctx.sizes), None, None


def copy_to_tp_region(x, group=None):
    """f: x unchanged; its gradient is all-reduced over ``group`` in backward."""
    return CopyToTensorParallelRegion.apply(x, group)


def reduce_from_tp_region(x, group=None):
    """g: the sum of every rank's x (all-reduce); the gradient passes through unchanged."""
    return ReduceFromTensorParallelRegion.apply(x, group)


def scatter_to_tp_region(x, group=None, sizes=None):
    """(..., n) -> (..., n_r), this rank's chunk; backward all-gathers the gradient."""
    return ScatterToTensorParallelRegion.apply(x, group, sizes)


def gather_from_tp_region(x, group=None, sizes=None):
    """(..., n_r) -> (..., n), every rank's chunk in rank order; backward keeps this rank's chunk."""
    return GatherFromTensorParallelRegion.apply(x, group, sizes)
