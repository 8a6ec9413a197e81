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

The column Function keeps the gathered x for dW by default (t times the shard's memory for this
tensor: sequence_parallel.nn's save_gathered=True); with save_gathered=False it keeps the shard
and gathers x again in backward, fused with dW's matmuls chunk by chunk (Megatron-LM overlaps
that all-gather with the dX matmul instead).
"""
import contextlib

import torch
import torch.distributed as dist
from torch.nn import functional as F

from tp_from_scratch.comm import Comm
from tp_from_scratch.nn.collectives import check_group, tensor_to_numpy, tp_rank, tp_world_size
from tp_from_scratch.nn.mappings import copy_to_tp_region
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


class TensorCommLink(CommLink):
    """CommLink on torch CPU tensors: each chunk travels as numpy's view of the tensor's own memory
    (nn.collectives' bridge, shared=True), so a receive lands in the tensor itself."""

    def send(self, chunk, dst):
        super().send(tensor_to_numpy(chunk, shared=True), dst)

    def recv(self, src, out):
        return super().recv(src, tensor_to_numpy(out, shared=True))


def _link(group):
    return TensorCommLink(group) if isinstance(group, Comm) else GroupLink(group)


def _chunks(x, t):
    """x cut along T by the array_split rule (views)."""
    return torch.split(x, shard_sizes(x.shape[SEQUENCE_AXIS], t), dim=SEQUENCE_AXIS)


def _collective(group, name, x, shape, **params):
    """On a Comm: the collective's fingerprint (what ranks must agree on) and its meter entry; else nothing."""
    if not isinstance(group, Comm):
        return contextlib.nullcontext()
    return group.collective(name, shape=shape, dtype=str(x.dtype), **params)


def _gather_loop(group, shard, sizes, matmul, steps):
    """The fused all-gather loop on ``group``: (pieces, products), one per rank's chunk."""
    with _collective(group, "all_gather_matmul", shard, (shard.shape[0], "*", *shard.shape[2:]), sizes=sizes):
        return all_gather_matmul_loop(
            _link(group), shard.contiguous(),
            lambda c: shard.new_empty((shard.shape[0], sizes[c], *shard.shape[2:])), matmul, steps)


def _gather_matmul(group, shard, sizes, matmul, steps):
    """(gathered shard (B, T, ...), the products concatenated along T), by the fused loop."""
    pieces, products = _gather_loop(group, shard, sizes, matmul, steps)
    return torch.cat(pieces, SEQUENCE_AXIS), torch.cat(products, SEQUENCE_AXIS)


def _regathered_weight_grad(group, x_shard, sizes, grad):
    """dW = dY^T x with x gathered again along T: chunk c's share dY[c]^T x[c] is computed while
    the next chunk travels (the fused loop), and the shares are added in T order. One matmul
    adds over all B*T rows in its own order, so the two agree within the tolerance policy."""
    r, p = tp_rank(group), len(sizes)
    starts = [sum(sizes[:c]) for c in range(p + 1)]
    in_hand = iter([(r - step) % p for step in range(p)])  # the chunk the loop multiplies at each step
    shares = [None] * p

    def share(piece):
        c = next(in_hand)
        g = grad[:, starts[c]:starts[c + 1]].reshape(-1, grad.shape[-1])  # (B*T_c, out/t)
        shares[c] = g.t() @ piece.reshape(-1, piece.shape[-1])           # (out/t, in)
    _gather_loop(group, x_shard, sizes, share, None)
    dw = shares[0]
    for c in range(1, p):
        dw = dw + shares[c]
    return dw


def _matmul_reduce_scatter(group, x, matmul, steps):
    """This rank's chunk along T of the sum over ranks of matmul(x), by the fused loop."""
    # the contraction width (in/t) may differ from rank to rank; batch and T may not
    with _collective(group, "matmul_reduce_scatter", x, (*x.shape[:-1], "*")):
        return matmul_reduce_scatter_loop(_link(group), _chunks(x, tp_world_size(group)), matmul, steps)


class AllGatherLinear(torch.autograd.Function):
    """Y_i = all_gather_T(x_r) @ W_i^T + b_i. forward: all-gather fused with the matmul;
    backward: reduce-scatter of dX fused with dX's matmul, and (save_gathered=False) the
    all-gather of x again, fused with dW's matmuls."""

    @staticmethod
    def forward(ctx, group, sizes, steps, save_gathered, x_shard, weight, bias):
        sizes = check_sizes(tp_rank(group), tp_world_size(group), x_shard.shape[SEQUENCE_AXIS], sizes)
        x, y = _gather_matmul(group, x_shard, sizes, lambda piece: F.linear(piece, weight, bias), steps)
        ctx.group, ctx.sizes, ctx.save_gathered, ctx.has_bias = group, sizes, save_gathered, bias is not None
        # the gathered x (B, T, in) for dW, or only this rank's shard (t times less memory)
        ctx.save_for_backward(x if save_gathered else x_shard, weight)
        return y  # (B, T, out/t), Sharded(-1)

    @staticmethod
    def backward(ctx, grad):
        saved, weight = ctx.saved_tensors
        dx = _matmul_reduce_scatter(ctx.group, grad, lambda g: g.matmul(weight), None)
        g2 = grad.reshape(-1, grad.shape[-1])
        if ctx.save_gathered:
            dw = g2.t() @ saved.reshape(-1, saved.shape[-1])  # one matmul, as autograd computes it
        else:
            dw = _regathered_weight_grad(ctx.group, saved, ctx.sizes, grad)
        return None, None, None, None, dx, dw, g2.sum(0) if ctx.has_bias else None


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


def all_gather_linear(group, x_shard, weight, bias=None, sizes=None, steps=None, save_gathered=True):
    """(B, T_r, in) Sharded(1) -> (B, T, out/t) Sharded(-1): a ColumnParallelLinear's weight (out/t, in)
    and bias applied to the sequence gathered by the fused loop.

    sizes: every rank's T_r (array_split of T); None means equal shards. steps: an optional
    collective_matmul.Steps recording the forward loop's matmuls, sends and waits.
    save_gathered: keep the gathered x for dW (True), or only the shard, gathering x again in
    backward fused with dW's matmuls (False: t times less memory, one more all-gather, dW equal
    within the tolerance policy), as sequence_parallel.nn's save_gathered.
    """
    return AllGatherLinear.apply(check_group(group), sizes, steps, save_gathered, x_shard, weight, bias)


def linear_reduce_scatter(group, x_local, weight, bias=None, steps=None):
    """(B, T, in/t) Sharded(-1) -> (B, T_r, out) Sharded(1): a RowParallelLinear's weight (out, in/t),
    its product reduce-scattered by the fused loop, then the Replicated bias on this rank's positions."""
    y = LinearReduceScatter.apply(check_group(group), steps, x_local, weight)
    return y if bias is None else y + copy_to_tp_region(group, bias)
