"""Deliberately broken adapters for tests/test_verify.py: each reproduces one bug pattern that
picotron (commit 59714b1) shipped and that our older checks missed, so the suite must FAIL the
check aimed at it. Written here from the description of each pattern, not copied.

    IN_PLACE_G          g all-reduces its input in place and returns it (the caller's tensor,
                        perhaps saved for backward, now holds the sum)
    IN_PLACE_F          f's backward all-reduces the incoming gradient in place (a gradient
                        shared with a residual branch changes under its other reader)
    COLUMN_ONLY_3D      a column layer that flattens (B, T, in) by hand: 2-D and 4-D inputs break
    GLOBAL_PADDING_IDX  a vocab-parallel embedding that applies the global padding_idx to its
                        local rows, so rank r > 0 zeroes the gradient of row start_r + padding_idx

They call torch.distributed directly, as picotron does, so they run under torchrun only.
``exercise_adapter(module)`` describes an Exercise 5a implementation (a known-wrong one, say).
"""
import torch
import torch.distributed as dist
from torch.nn import functional as F

from tp_from_scratch.nn.embedding import VocabParallelEmbedding
from tp_from_scratch.nn.linear import ColumnParallelLinear
from tp_from_scratch.nn.mappings import copy_to_tp_region
from tp_from_scratch.verify import FEATURES, Adapter

NATIVE = set(FEATURES) - {"comm"}


class _ReduceInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x):
        dist.all_reduce(x, group=group)  # the bug: x itself becomes the sum
        return x

    @staticmethod
    def backward(ctx, grad):
        return None, grad


class _CopyReducingGradInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        dist.all_reduce(grad, group=ctx.group)  # the bug: the gradient handed in is overwritten
        return None, grad


class _Column3D(ColumnParallelLinear):
    def forward(self, x):
        batch, seq, _ = x.shape  # the bug: only (B, T, in) unpacks
        x = copy_to_tp_region(self.group, x).reshape(batch * seq, self.in_features)
        return F.linear(x, self.weight, self.bias).reshape(batch, seq, -1)


class _EmbeddingGlobalPadding(VocabParallelEmbedding):
    def forward(self, ids):
        outside = (ids < self.vocab_start) | (ids >= self.vocab_stop)
        local_ids = (ids - self.vocab_start).masked_fill(outside, 0)
        rows = F.embedding(local_ids, self.weight, self.padding_idx)  # the bug: a global index
        rows = rows.masked_fill(outside.unsqueeze(-1), 0.0)
        out = rows.clone()
        dist.all_reduce(out, group=self.group)
        return _Sum.apply(rows, out)


class _Sum(torch.autograd.Function):
    """Hands back the all-reduced rows; the gradient flows to the local rows unchanged (g)."""

    @staticmethod
    def forward(ctx, rows, reduced):
        return reduced

    @staticmethod
    def backward(ctx, grad):
        return grad, None


IN_PLACE_G = Adapter(name="bug: g in place", g=lambda group, x: _ReduceInPlace.apply(group, x),
                     supports=NATIVE)
IN_PLACE_F = Adapter(name="bug: f grad in place",
                     f=lambda group, x: _CopyReducingGradInPlace.apply(group, x), supports=NATIVE)
COLUMN_ONLY_3D = Adapter(
    name="bug: column 3-D only", supports=NATIVE - {"gather_output"},
    column=lambda group, linear, gather_output=False: _Column3D.from_linear(linear, group=group))
GLOBAL_PADDING_IDX = Adapter(
    name="bug: global padding_idx", supports=NATIVE,
    embedding=lambda group, table: _EmbeddingGlobalPadding.from_embedding(table, group=group))

# which (component, check) each broken adapter must FAIL
TARGETS = {
    "IN_PLACE_G": ("g", "inputs untouched"),
    "IN_PLACE_F": ("f", "inputs untouched"),
    "COLUMN_ONLY_3D": ("column", "2-D input"),
    "GLOBAL_PADDING_IDX": ("embedding", "padding_idx"),
}


def exercise_adapter(module, name):
    """An Exercise 5a module (its four mapping Functions and two layers) as an Adapter."""
    return Adapter(
        name=name,
        column=lambda group, linear, gather_output=False: module.ColumnParallelLinear.from_linear(
            linear, group=group, gather_output=gather_output),
        row=lambda group, linear, input_is_parallel=True: module.RowParallelLinear.from_linear(
            linear, group=group, input_is_parallel=input_is_parallel),
        f=lambda group, x: module.CopyToTensorParallelRegion.apply(group, x),
        g=lambda group, x: module.ReduceFromTensorParallelRegion.apply(group, x),
        scatter=lambda group, x: module.ScatterToTensorParallelRegion.apply(group, x),
        gather=lambda group, x: module.GatherFromTensorParallelRegion.apply(group, x),
        supports={"comm", "gather_output", "scatter_input"})
