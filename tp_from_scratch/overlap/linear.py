"""A column-parallel linear layer whose backward hides the dX all-reduce behind the dW matmul.

Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication. In a column-parallel layer
(Y_i = X @ W_i^T + b_i, X replicated) backward needs three products:

    dX_i = dY_i @ W_i         (B, T, H), Partial: every rank's block contributes to dX
    dW_i = dY_i^T @ X         (out/t, in), this rank's own: no communication
    db_i = sum of dY_i        (out/t,)

and the all-reduce of dX_i (f's backward). dW and db do not need the all-reduce's result,
so backward starts the all-reduce, computes dW and db while it is in flight, and only then
waits. The arithmetic is unchanged: outputs and gradients equal ColumnParallelLinear's bit
for bit; what changes is when the all-reduce's time is paid.

The group decides how the all-reduce runs, as everywhere in the course:
    torch ProcessGroup  dist.all_reduce(dX_i, async_op=True), then work.wait()
    Comm                all_reduce_async(comm, dX_i) (overlap.nonblocking), then handle.wait()

forward: identity on X (f), local matmul; backward: all-reduce of dX, overlapped with dW.
"""
import time

import torch
import torch.distributed as dist
from torch.nn import functional as F

from tp_from_scratch.comm import Comm
from tp_from_scratch.nn.collectives import all_reduce, numpy_to_tensor, tensor_to_numpy, tp_rank
from tp_from_scratch.nn.linear import ColumnParallelLinear
from tp_from_scratch.nn.mappings import gather_from_tp_region
from tp_from_scratch.overlap.nonblocking import all_reduce_async


class Pending:
    """An all-reduce started by start_all_reduce: ``wait()`` returns the summed tensor."""

    def __init__(self, wait):
        self.wait = wait


def start_all_reduce(group, x, overlap=True):
    """Start the sum of ``x`` over ``group`` and return a Pending; ``x`` stays untouched.

    overlap=False runs it to completion before returning (the blocking baseline).
    """
    if not overlap:
        result = all_reduce(group, x)
        return Pending(lambda: result)
    if isinstance(group, Comm):
        handle = all_reduce_async(group, tensor_to_numpy(x))
        return Pending(lambda: numpy_to_tensor(handle.wait(), x))
    y = x.detach().contiguous().clone()  # torch reduces in place; the caller keeps x
    work = dist.all_reduce(y, group=group, async_op=True)
    return Pending(lambda: (work.wait(), y)[1])


class Timeline:
    """Wall-clock intervals of one rank's backward pieces: [(what, start, stop), ...].

    Pass one to AsyncColumnParallelLinear(timeline=...) to see where backward spends its
    time; ``exposed_seconds`` is the time spent waiting for the all-reduce.
    """

    def __init__(self):
        self.events = []

    def record(self, what, start):
        self.events.append((what, start, time.perf_counter()))

    def total(self, what):
        return sum(stop - start for name, start, stop in self.events if name == what)

    def clear(self):
        self.events = []


class LinearWithAsyncAllReduce(torch.autograd.Function):
    """Y = X @ W^T + b. forward: identity on X (f), then the matmul; backward: dX all-reduced,
    started before dW and db are computed and waited for after (overlap=True)."""

    @staticmethod
    def forward(ctx, group, x, weight, bias, overlap, timeline):
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.overlap, ctx.timeline, ctx.has_bias = group, overlap, timeline, bias is not None
        return F.linear(x, weight, bias)  # (..., out/t), Sharded(-1)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        mark = time.perf_counter
        start = mark()
        grad_x = grad.matmul(weight)  # (..., in), Partial: this rank's block's share of dX
        _note(ctx.timeline, "dX matmul", start)
        start = mark()
        pending = start_all_reduce(ctx.group, grad_x, ctx.overlap)  # in flight from here
        _note(ctx.timeline, "start all-reduce" if ctx.overlap else "all-reduce (blocking)", start)
        start = mark()
        grad_2d = grad.reshape(-1, grad.shape[-1])  # (B*T, out/t)
        grad_weight = grad_2d.t().mm(x.reshape(-1, x.shape[-1]))  # (out/t, in): autograd's own order
        grad_bias = grad_2d.sum(0) if ctx.has_bias else None
        _note(ctx.timeline, "dW, db matmul", start)
        start = mark()
        grad_x = pending.wait()  # (..., in), Replicated
        _note(ctx.timeline, "wait all-reduce", start)
        return None, grad_x, grad_weight, grad_bias, None, None


def _note(timeline, what, start):
    if timeline is not None:
        timeline.record(what, start)


class AsyncColumnParallelLinear(ColumnParallelLinear):
    """ColumnParallelLinear whose backward overlaps the dX all-reduce with the dW matmul.

    Same parameters, same shards, same results as ColumnParallelLinear (from_linear works
    too). overlap=False keeps the order of the blocking layer (all-reduce, then dW), for
    measuring the difference; ``timeline``: an optional Timeline that records each piece.
    forward: f (identity), local matmul (+ all-gather with gather_output);
    backward: all-reduce of dX, started before and waited for after the dW matmul.
    """

    def __init__(self, *args, overlap=True, timeline=None, **kwargs):
        super().__init__(*args, **kwargs)
        if self.replicas != 1 or self.input_is_copied:
            raise ValueError(f"rank {tp_rank(self.group)}: AsyncColumnParallelLinear does its own f "
                             "(input_is_copied=False) and has no replicated blocks (replicas=1)")
        self.overlap, self.timeline = overlap, timeline

    def forward(self, x):
        # x: (..., in), Replicated
        y = LinearWithAsyncAllReduce.apply(self.group, x, self.weight, self.bias, self.overlap, self.timeline)
        if self.gather_output:
            y = gather_from_tp_region(self.group, y, self.output_sizes)  # (..., out), Replicated
        return y


def predicted_backward(tokens, in_features, out_per_rank, t, flops, alpha, beta, itemsize=4,
                       own_engine=True):
    """Alpha-beta-gamma model of this layer's backward: {blocking, overlap, exposed_*} seconds.

    dX and dW are each 2 * tokens * in * out/t FLOPs at ``flops`` FLOP/s; the dX all-reduce is
    a ring over t ranks of tokens * in * itemsize bytes (algorithms.predicted_seconds).
    own_engine=True: the interconnect moves the bytes without the compute units (a GPU's
    NVLink/copy engines; NCCL still borrows a few SMs, ignored here), so with overlap the
    all-reduce and dW run at the same time. own_engine=False: one core does both (a CPU
    rank with one core), so overlap can only hide time the all-reduce spends waiting.
    """
    from tp_from_scratch.overlap.algorithms import predicted_seconds
    matmul = 2 * tokens * in_features * out_per_rank / flops
    reduce = predicted_seconds("ring", t, tokens * in_features * itemsize, alpha, beta)
    hidden = min(reduce, matmul) if own_engine else 0.0
    return {"dX": matmul, "dW": matmul, "all_reduce": reduce,
            "blocking": 2 * matmul + reduce, "overlap": 2 * matmul + reduce - hidden,
            "exposed_blocking": reduce, "exposed_overlap": reduce - hidden}
