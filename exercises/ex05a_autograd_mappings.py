"""Exercise 5a: Megatron's region mappings as torch autograd Functions, and the parallel
linear layers built on them (lessons/05_autograd_tensor_parallel.ipynb).

Replace each `raise NotImplementedError(...)` with your code, then run
    make grade            (or: .venv/bin/python -m pytest exercises -m ex05a -x)

Everything runs on ONE rank. `group` is that rank's communicator: the graders pass the
simulated ranks' Comm, a real run passes a torch ProcessGroup; you never need to know
which. The tensor collectives below (imported from the library) work on both, take the
group first (as the numpy collectives of Lesson 2 take the communicator first), return new
tensors and never modify their input:

    all_reduce(group, x)                -> the sum of x over the ranks, on every rank
    all_gather(group, x)                -> every rank's x side by side along the last dim
    split(group, x)                     -> this rank's contiguous chunk of the last dim
    tp_rank(group), tp_world_size(group)

An autograd Function's forward receives `ctx` (keep what backward needs on it, e.g.
`ctx.group = group`), then its inputs in the order `apply` was called with, here
`(group, x)`, and returns the output; backward receives dL/d(output) and returns one
gradient per forward input, in the same order (None for `group`). The graders count your
collectives: an extra or a missing all-reduce fails even when the numbers come out right.
At t = 1 you may skip a collective (Megatron-LM does); the graders count them only for t > 1,
but g's and gather's forward still return a new tensor there (x.clone()), never x itself.
Never modify a forward input or the gradient backward receives (the graders check both).
An identity (f's forward, g's backward) may return its input as is, as Megatron's does;
scatter's chunk may not (also at t = 1): it is a new tensor, never a view x[..., chunk]
(`split` copies), so a write into this rank's chunk can never change the replicated x.

Shapes: x (B, T, H). torch stores a Linear's weight as (out, in): y = x @ W^T + b.
Split sizes are even here (t divides every size the graders use).
"""
import torch
from torch import nn
from torch.nn import functional as F  # noqa: F401

from tp_from_scratch.nn.mappings import all_gather, all_reduce, split, tp_rank, tp_world_size  # noqa: F401


# -- the four region mappings --------------------------------------------------------------

class CopyToTensorParallelRegion(torch.autograd.Function):
    """f. forward: identity (x is replicated); backward: all-reduce the gradient."""

    @staticmethod
    def forward(ctx, group, x):
        raise NotImplementedError("Exercise 5a (CopyToTensorParallelRegion): see lessons/05_autograd_tensor_parallel.ipynb")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("Exercise 5a (CopyToTensorParallelRegion): see lessons/05_autograd_tensor_parallel.ipynb")


class ReduceFromTensorParallelRegion(torch.autograd.Function):
    """g. forward: all-reduce the partial sums; backward: identity."""

    @staticmethod
    def forward(ctx, group, x):
        raise NotImplementedError("Exercise 5a (ReduceFromTensorParallelRegion): see lessons/05_autograd_tensor_parallel.ipynb")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("Exercise 5a (ReduceFromTensorParallelRegion): see lessons/05_autograd_tensor_parallel.ipynb")


class ScatterToTensorParallelRegion(torch.autograd.Function):
    """forward: keep this rank's chunk of the last dim (..., n) -> (..., n/t); backward: all-gather."""

    @staticmethod
    def forward(ctx, group, x):
        raise NotImplementedError("Exercise 5a (ScatterToTensorParallelRegion): see lessons/05_autograd_tensor_parallel.ipynb")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("Exercise 5a (ScatterToTensorParallelRegion): see lessons/05_autograd_tensor_parallel.ipynb")


class GatherFromTensorParallelRegion(torch.autograd.Function):
    """forward: all-gather the chunks along the last dim (..., n/t) -> (..., n); backward: keep own chunk."""

    @staticmethod
    def forward(ctx, group, x):
        raise NotImplementedError("Exercise 5a (GatherFromTensorParallelRegion): see lessons/05_autograd_tensor_parallel.ipynb")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("Exercise 5a (GatherFromTensorParallelRegion): see lessons/05_autograd_tensor_parallel.ipynb")


# -- the two parallel linear layers -----------------------------------------------------------
# __init__ is written for you: it makes empty parameters of this rank's local shapes.
# Write from_linear (copy this rank's shard of a single-device nn.Linear) and forward,
# using YOUR Functions above (call them as CopyToTensorParallelRegion.apply(self.group, x)).
# from_linear COPIES the shard: a parameter that is a view of linear.weight would let an
# optimizer step on the parallel layer change the single-device layer (the graders check).
# As in the library, a layer takes its group as a required keyword argument: group=...

class ColumnParallelLinear(nn.Module):
    """Y_i = X @ W_i^T + b_i: rank i holds rows i of W (out/t of them) and entries i of b."""

    def __init__(self, in_features, out_features, bias=True, gather_output=False, *, group):
        super().__init__()
        self.group, self.gather_output = group, gather_output
        self.in_features, self.out_features = in_features, out_features
        local_out = out_features // tp_world_size(group)
        self.weight = nn.Parameter(torch.empty(local_out, in_features))         # (out/t, in)
        self.bias = nn.Parameter(torch.empty(local_out)) if bias else None       # (out/t,)

    @classmethod
    def from_linear(cls, linear, *, group, gather_output=False):
        """A ColumnParallelLinear holding this rank's rows of linear.weight (and its block of the bias).

        The result must have linear's dtype; e.g. build it, then `.to(linear.weight.dtype)`
        and copy the data in under `torch.no_grad()`.
        """
        raise NotImplementedError("Exercise 5a (ColumnParallelLinear): see lessons/05_autograd_tensor_parallel.ipynb")

    def forward(self, x):
        """x (B, T, in), replicated -> (B, T, out/t), or (B, T, out) with gather_output."""
        raise NotImplementedError("Exercise 5a (ColumnParallelLinear): see lessons/05_autograd_tensor_parallel.ipynb")


class RowParallelLinear(nn.Module):
    """Y = sum_i X_i @ W_i^T + b: rank i holds columns i of W (in/t of them); b is added once."""

    def __init__(self, in_features, out_features, bias=True, input_is_parallel=True, *, group):
        super().__init__()
        self.group, self.input_is_parallel = group, input_is_parallel
        self.in_features, self.out_features = in_features, out_features
        local_in = in_features // tp_world_size(group)
        self.weight = nn.Parameter(torch.empty(out_features, local_in))         # (out, in/t)
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None    # (out,), replicated

    @classmethod
    def from_linear(cls, linear, *, group, input_is_parallel=True):
        """A RowParallelLinear holding this rank's columns of linear.weight and the whole bias."""
        raise NotImplementedError("Exercise 5a (RowParallelLinear): see lessons/05_autograd_tensor_parallel.ipynb")

    def forward(self, x):
        """x (B, T, in/t) (or (B, T, in) when not input_is_parallel) -> (B, T, out), replicated."""
        raise NotImplementedError("Exercise 5a (RowParallelLinear): see lessons/05_autograd_tensor_parallel.ipynb")
