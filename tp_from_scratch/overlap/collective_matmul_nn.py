"""The collective matmul in torch: two autograd Functions, group first.

    all_gather_linear(group, x_shard, weight, bias, sizes)   Y_i = all_gather_T(x_r) @ W_i^T + b_i
        forward: the ring all-gather along T fused with the matmul (collective_matmul's loop)
        backward: dX = reduce_scatter_T(dY_i @ W_i) fused the same way; dW_i = dY_i^T x, db_i = sum dY_i
    linear_reduce_scatter(group, x_local, weight, bias)      y_r = reduce_scatter_T(x_i @ W_i^T) + f(b)
        forward: the matmul fused with the ring reduce-scatter along T
        backward: dX_i = all_gather_T(dy_r) @ W_i fused; dW_i = dy^T x_i; the bias through f
                  (its Partial gradient all-reduced, as in sequence_parallel.nn.row_linear_to_sequence)

They compute what sequence_parallel.nn's column_linears_from_sequence and row_linear_to_sequence
compute (weights in nn.Linear's (out, in) layout, the same shards), moving the same chunks.
``group``: a tp_from_scratch Comm (comm.isend / comm.irecv; the tensors' memory is shared with
numpy, so receives land in place; float32/float64 only) or a torch ProcessGroup
(dist.isend / dist.irecv, gloo or nccl). The un-fused path's native reduce-scatter adds in
gloo's order, not the ring's: on a ProcessGroup the fused result equals it within the
tolerance policy (bit for bit with integer-valued inputs); see collective_matmul for why
the matmul by row blocks can differ in the last bits too.

The column Function keeps the gathered x for dW (t times the shard's memory for this tensor:
sequence_parallel.nn's save_gathered=True); re-gathering it in backward would be one more
all-gather, which Megatron-LM overlaps with the dX matmul.
"""
import contextlib

import torch
import torch.distributed as dist
from torch.nn import functional as F

from tp_from_scratch.comm import Comm
from tp_from_scratch.nn.mappings import check_group, copy_to_tp_region, tp_rank, tp_world_size
from tp_from_scratch.overlap.collective_matmul import (SEQUENCE_AXIS, CommLink, all_gather_matmul_loop,
                                                       check_sizes, matmul_reduce_scatter_loop)
from tp_from_scratch.sharding import shard_sizes


class _Arrived:
    """A receive with nothing to receive (an empty chunk is never sent on a ProcessGroup)."""

    @staticmethod
    def wait():
        return None


class GroupLink:
    """Chunks over a torch ProcessGroup: dist.isend / dist.irecv; finish() waits for the sends."""

    def __init__(self, group):
        self.group, self.rank, self.world_size = group, tp_rank(group), tp_world_size(group)
        self._sends = []  # (work, tensor): the tensor must live until its send completes

    def _global(self, rank):
        return dist.get_global_rank(self.group, rank)

    def send(self, chunk, dst):
        if chunk.numel():
            chunk = chunk.contiguous()
            self._sends.append((dist.isend(chunk, self._global(dst), group=self.group), chunk))

    def recv(self, src, out):
        if not out.numel():
            return _Arrived
        return dist.irecv(out, self._global(src), group=self.group)

    def finish(self):
        for work, _ in self._sends:
            work.wait()
        self._sends = []


def _link(group):
    return CommLink(group) if isinstance(group, Comm) else GroupLink(group)


def _chunks(x, t):
    """x cut along T by the array_split rule (views)."""
    return torch.split(x, shard_sizes(x.shape[SEQUENCE_AXIS], t), dim=SEQUENCE_AXIS)


def _collective(group, name, x, shape, **params):
    """On a Comm: the collective's fingerprint (what ranks must agree on) and its meter entry; else nothing."""
    if not isinstance(group, Comm):
        return contextlib.nullcontext()
    return group.collective(name, shape=shape, dtype=str(x.dtype), **params)


def _gather_matmul(group, shard, sizes, matmul, steps):
    """(gathered shard (B, T, ...), the products concatenated along T), by the fused loop."""
    with _collective(group, "all_gather_matmul", shard, (shard.shape[0], "*", *shard.shape[2:]), sizes=sizes):
        pieces, products = all_gather_matmul_loop(
            _link(group), shard.contiguous(),
            lambda c: shard.new_empty((shard.shape[0], sizes[c], *shard.shape[2:])), matmul, steps)
    return torch.cat(pieces, SEQUENCE_AXIS), torch.cat(products, SEQUENCE_AXIS)


def _matmul_reduce_scatter(group, x, matmul, steps):
    """This rank's chunk along T of the sum over ranks of matmul(x), by the fused loop."""
    # the contraction width (in/t) may differ from rank to rank; batch and T may not
    with _collective(group, "matmul_reduce_scatter", x, (*x.shape[:-1], "*")):
        return matmul_reduce_scatter_loop(_link(group), _chunks(x, tp_world_size(group)), matmul, steps)


class AllGatherLinear(torch.autograd.Function):
    """Y_i = all_gather_T(x_r) @ W_i^T + b_i. forward: all-gather fused with the matmul;
    backward: reduce-scatter of dX fused with dX's matmul."""

    @staticmethod
    def forward(ctx, group, sizes, steps, x_shard, weight, bias):
        sizes = check_sizes(tp_rank(group), tp_world_size(group), x_shard.shape[SEQUENCE_AXIS], sizes)
        x, y = _gather_matmul(group, x_shard, sizes, lambda piece: F.linear(piece, weight, bias), steps)
        ctx.group, ctx.has_bias = group, bias is not None
        ctx.save_for_backward(x, weight)  # x (B, T, in): the gathered input, for dW
        return y  # (B, T, out/t), Sharded(-1)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        dx = _matmul_reduce_scatter(ctx.group, grad, lambda g: g.matmul(weight), None)
        g2, x2 = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
        return None, None, None, dx, g2.t() @ x2, g2.sum(0) if ctx.has_bias else None


class LinearReduceScatter(torch.autograd.Function):
    """y_r = reduce_scatter_T(x_i @ W_i^T). forward: the matmul fused with the reduce-scatter;
    backward: all-gather of dy fused with dX's matmul."""

    @staticmethod
    def forward(ctx, group, steps, x_local, weight):
        t = tp_world_size(group)
        ctx.group, ctx.sizes = group, shard_sizes(x_local.shape[SEQUENCE_AXIS], t)
        ctx.save_for_backward(x_local, weight)
        return _matmul_reduce_scatter(group, x_local, lambda c: F.linear(c, weight), steps)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        dy, dx = _gather_matmul(ctx.group, grad, ctx.sizes, lambda g: g.matmul(weight), None)
        dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
        return None, None, dx, dy2.t() @ x2


def all_gather_linear(group, x_shard, weight, bias=None, sizes=None, steps=None):
    """(B, T_r, in) Sharded(1) -> (B, T, out/t) Sharded(-1): a ColumnParallelLinear's weight (out/t, in)
    and bias applied to the sequence gathered by the fused loop.

    sizes: every rank's T_r (array_split of T); None means equal shards. steps: an optional
    collective_matmul.Steps recording the forward loop's matmuls, sends and waits.
    """
    return AllGatherLinear.apply(check_group(group), sizes, steps, x_shard, weight, bias)


def linear_reduce_scatter(group, x_local, weight, bias=None, steps=None):
    """(B, T, in/t) Sharded(-1) -> (B, T_r, out) Sharded(1): a RowParallelLinear's weight (out, in/t),
    its product reduce-scattered by the fused loop, then the Replicated bias on this rank's positions."""
    y = LinearReduceScatter.apply(check_group(group), steps, x_local, weight)
    return y if bias is None else y + copy_to_tp_region(group, bias)
