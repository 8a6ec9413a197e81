"""Column- and row-parallel linear layers (Megatron-LM), as torch modules.

torch stores a Linear's weight as (out, in) and computes Y = X @ W^T + b. With t ranks:

    ColumnParallelLinear   W[out_t, in]:  rank i holds rows i of W (a block of output features)
        X (replicated) -f-> X @ W_i^T + b_i = Y_i   (B, T, out/t), Sharded(-1)
        optional gather -> Y (B, T, out), Replicated
    RowParallelLinear      W[out, in_t]:  rank i holds columns i of W (a block of input features)
        X_i (B, T, in/t), Sharded(-1) -> X_i @ W_i^T   (B, T, out), Partial
        -g-> sum over ranks, then + b once            (B, T, out), Replicated

A column layer followed by a row layer (the Megatron MLP) needs one all-reduce forward (g)
and one backward (f), and nothing in between.

Uneven sizes are allowed: the feature axis is split like numpy.array_split (the first
``n % t`` ranks hold one more), which is what a vocabulary or an FFN width that t does not divide
needs; ``sizes=`` gives the blocks explicitly, as a model's attention does to keep every head whole
when t does not divide the heads (a later lesson's).
"""
import math

import torch
from torch import nn
from torch.nn import functional as F

from tp_from_scratch.nn.mappings import (
    copy_to_tp_region,
    gather_from_tp_region,
    reduce_from_tp_region_,
    scatter_to_tp_region,
    sum_over_replicas,
    tp_rank,
    tp_world_size,
)
from tp_from_scratch.sharding import shard_sizes


def _init_full_linear(out_features, in_features, bias, dtype, device):
    """The full weight and bias drawn exactly like torch.nn.Linear's default initialisation.

    Every rank draws the whole matrix and keeps its block (Megatron's CPU initialisation):
    with the same seed on every rank this equals nn.Linear(in, out) built with that seed.
    Costs the full weight's memory once, for a moment; use from_linear for big layers.
    """
    w = torch.empty(out_features, in_features, dtype=dtype, device=device)
    nn.init.kaiming_uniform_(w, a=math.sqrt(5))
    b = None
    if bias:
        bound = 1 / math.sqrt(in_features) if in_features > 0 else 0
        b = torch.empty(out_features, dtype=dtype, device=device).uniform_(-bound, bound)
    return w, b


def _block_sizes(sizes, features, blocks, rank, what):
    """The ``blocks`` sizes a layer's ``features`` split into: ``sizes`` checked, or shard_sizes."""
    if sizes is None:
        return shard_sizes(features, blocks)
    sizes = [int(n) for n in sizes]
    if len(sizes) != blocks or sum(sizes) != features or min(sizes) < 0:
        raise ValueError(f"rank {rank}: {what} sizes {sizes} do not split {features} features into {blocks} blocks")
    return sizes


class ColumnParallelLinear(nn.Module):
    """Y_i = X @ W_i^T + b_i: this rank's block of output features (a column block of Y).

    forward: f (identity) on X, then the local matmul; with gather_output, an all-gather of Y.
    backward: the f all-reduces dX (every rank's block contributed to it); with gather_output,
    the gather's backward keeps this rank's block of dY.
    Local weight (out/t, in), local bias (out/t,).

    replicas=r: the output features are cut into t/r blocks and r neighbouring ranks hold the
    same block (a KV head shared by several ranks when there are fewer KV heads than ranks);
    the copies' gradients are summed among them in backward. Local weight (r*out/t, in).

    sizes: the t/r blocks' sizes, summing to out (default sharding.shard_sizes: numpy.array_split's
    rule); a model splitting at head boundaries passes its own.
    """

    def __init__(self, in_features, out_features, bias=True, gather_output=False, *, group,
                 input_is_copied=False, replicas=1, sizes=None, dtype=None, device=None, init=True):
        super().__init__()
        self.group, self.gather_output = group, gather_output
        # input_is_copied: the caller already applied f, once for several layers reading the
        # same input (attention's q, k, v), so backward all-reduces their summed dX only once
        self.input_is_copied = input_is_copied
        self.in_features, self.out_features = in_features, out_features
        t, rank = tp_world_size(group), tp_rank(group)
        if replicas < 1 or t % replicas != 0:
            raise ValueError(f"rank {rank}: replicas={replicas} does not divide tp={t}")
        if replicas > 1 and gather_output:
            raise ValueError(f"rank {rank}: gather_output with replicas={replicas} would gather "
                             f"every replicated block {replicas} times")
        self.replicas = replicas
        blocks = t // replicas
        self.output_sizes = _block_sizes(sizes, out_features, blocks, rank, "output")  # every block, for the gather
        self.output_start = sum(self.output_sizes[:rank // replicas])
        self.output_stop = self.output_start + self.output_sizes[rank // replicas]
        local_out = self.output_stop - self.output_start
        self.weight = nn.Parameter(torch.empty(local_out, in_features, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.empty(local_out, dtype=dtype, device=device)) if bias else None
        if init:
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        """Draw the full nn.Linear-style weight (same default RNG on every rank) and keep this block."""
        w, b = _init_full_linear(self.out_features, self.in_features, self.bias is not None,
                                 self.weight.dtype, self.weight.device)
        self.weight.copy_(w[self.output_start:self.output_stop])
        if self.bias is not None:
            self.bias.copy_(b[self.output_start:self.output_stop])

    @classmethod
    def from_linear(cls, linear, *, group, gather_output=False, replicas=1, sizes=None):
        """This rank's shard of a single-device torch.nn.Linear (its rows of W and entries of b).

        The shard is a copy: training it never changes ``linear``.
        """
        w = linear.weight
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, gather_output,
                    group=group, replicas=replicas, sizes=sizes, dtype=w.dtype, device=w.device, init=False)
        with torch.no_grad():
            layer.weight.copy_(w[layer.output_start:layer.output_stop])
            if linear.bias is not None:
                layer.bias.copy_(linear.bias[layer.output_start:layer.output_stop])
        return layer

    def forward(self, x):
        # x: (..., in), Replicated. f makes backward sum dX over the ranks.
        if not self.input_is_copied:
            x = copy_to_tp_region(self.group, x)
        weight = sum_over_replicas(self.group, self.weight, self.replicas)
        bias = self.bias if self.bias is None else sum_over_replicas(self.group, self.bias, self.replicas)
        y = F.linear(x, weight, bias)  # (..., out/t), Sharded(-1)
        if self.gather_output:
            y = gather_from_tp_region(self.group, y, self.output_sizes)  # (..., out), Replicated
        return y

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"(local {self.weight.shape[0]}), bias={self.bias is not None}, "
                f"gather_output={self.gather_output}"
                + (f", replicas={self.replicas}" if self.replicas > 1 else ""))


class RowParallelLinear(nn.Module):
    """Y = sum_i X_i @ W_i^T + b: this rank's block of input features, partial sums all-reduced.

    forward: (scatter of X unless input_is_parallel), local matmul, g (all-reduce), + b once.
    backward: g's backward is the identity; the scatter's backward all-gathers dX.
    Local weight (out, in/t); the bias (out,) is replicated and added after the reduction,
    so it is counted once, not t times. sizes: the t blocks of input features (default
    sharding.shard_sizes), as for ColumnParallelLinear.
    """

    def __init__(self, in_features, out_features, bias=True, input_is_parallel=True, *, group,
                 sizes=None, dtype=None, device=None, init=True):
        super().__init__()
        self.group, self.input_is_parallel = group, input_is_parallel
        self.in_features, self.out_features = in_features, out_features
        t, rank = tp_world_size(group), tp_rank(group)
        self.input_sizes = _block_sizes(sizes, in_features, t, rank, "input")
        self.input_start = sum(self.input_sizes[:rank])
        self.input_stop = self.input_start + self.input_sizes[rank]
        local_in = self.input_stop - self.input_start
        self.weight = nn.Parameter(torch.empty(out_features, local_in, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device)) if bias else None
        if init:
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        """Draw the full nn.Linear-style weight (same default RNG on every rank) and keep this block."""
        w, b = _init_full_linear(self.out_features, self.in_features, self.bias is not None,
                                 self.weight.dtype, self.weight.device)
        self.weight.copy_(w[:, self.input_start:self.input_stop])
        if self.bias is not None:
            self.bias.copy_(b)

    @classmethod
    def from_linear(cls, linear, *, group, input_is_parallel=True, sizes=None):
        """This rank's shard of a single-device torch.nn.Linear (its columns of W, all of b).

        The shard is a copy: training it never changes ``linear``.
        """
        w = linear.weight
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None,
                    input_is_parallel, group=group, sizes=sizes, dtype=w.dtype, device=w.device, init=False)
        with torch.no_grad():
            layer.weight.copy_(w[:, layer.input_start:layer.input_stop])
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x):
        if not self.input_is_parallel:
            # x: (..., in), Replicated -> this rank's block (..., in/t)
            x = scatter_to_tp_region(self.group, x, self.input_sizes)
        y = F.linear(x, self.weight)           # (..., out), Partial: one term of the sum
        y = reduce_from_tp_region_(self.group, y)  # (..., out), Replicated; summed in place (y is ours)
        if self.bias is not None:
            y = y + self.bias  # after g: added once, not once per rank
        return y

    def extra_repr(self):
        return (f"in_features={self.in_features} (local {self.weight.shape[1]}), "
                f"out_features={self.out_features}, bias={self.bias is not None}, "
                f"input_is_parallel={self.input_is_parallel}")
