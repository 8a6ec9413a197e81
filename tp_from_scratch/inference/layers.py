"""Lesson 5's row-parallel layer with its all-reduce changed or dropped, and Lesson 6's block
with Sync-Point Drop. Forward only: these are inference-time techniques (no paper here trains
through them), so nothing below defines a backward.

    PartialRowParallelLinear     Y_i = X_i W_i^T: the partial sum, no g, no bias    output Partial
    QuantizedRowParallelLinear   Y = quantized_all_reduce(X_i W_i^T) + b           output Replicated
    SyncPointDropBlock           one all-reduce per block instead of two (SPD)

Each takes its ``group`` explicitly (a ProcessGroup or a Comm) and keeps the parameter names of
the layer it replaces, so a checkpoint of the ordinary TP GPT loads into it unchanged.
"""
import functools

import torch
from torch import nn
from torch.nn import functional as F

from tp_from_scratch.gpt.arch import ROWWISE, plan_modules
from tp_from_scratch.inference.quantized import check_quantization, quantized_all_reduce
from tp_from_scratch.nn import RowParallelLinear
from tp_from_scratch.nn.collectives import all_reduce


def _copy_of(cls, row, **options):
    """A ``cls`` holding a copy of the RowParallelLinear ``row``'s shard (its columns of W, all of b)."""
    w = row.weight
    layer = cls(row.in_features, row.out_features, row.bias is not None, row.input_is_parallel,
                group=row.group, sizes=row.input_sizes, dtype=w.dtype, device=w.device, init=False, **options)
    with torch.no_grad():
        layer.weight.copy_(w)
        if row.bias is not None:
            layer.bias.copy_(row.bias)
    return layer


class PartialRowParallelLinear(RowParallelLinear):
    """X_i (..., in/t) Sharded -> X_i @ W_i^T (..., out) Partial: this rank's term of the sum.

    No collective: the caller sums the partials (SPD sums attention's with the MLP's), and adds
    the bias ``self.bias`` once after that sum.
    """

    def forward(self, x):
        return F.linear(x, self.weight)                 # (..., out), Partial

    @classmethod
    def from_row(cls, row):
        """A copy of ``row``'s shard (a RowParallelLinear) that returns the partial sum."""
        return _copy_of(cls, row)


class QuantizedRowParallelLinear(RowParallelLinear):
    """Y = sum_i QDQ-reduced (X_i @ W_i^T) + b: Lesson 5's row layer whose g sends ``bits`` per
    number (quantized.quantized_all_reduce: the two-step or the all-gather scheme, groups of
    ``group_size``). bits = 16: the ordinary RowParallelLinear. Forward only."""

    def __init__(self, in_features, out_features, bias=True, input_is_parallel=True, *, group, bits=8,
                 group_size=128, scheme="two_step", sizes=None, dtype=None, device=None, init=True):
        check_quantization(bits, group_size, scheme)
        super().__init__(in_features, out_features, bias, input_is_parallel, group=group, sizes=sizes, dtype=dtype,
                         device=device, init=init)
        self.bits, self.group_size, self.scheme = bits, group_size, scheme

    def forward(self, x):                               # x (..., in/t) Sharded
        partial = F.linear(x, self.weight)              # (..., out) Partial
        y = quantized_all_reduce(self.group, partial, self.bits, self.group_size, self.scheme)
        return y if self.bias is None else y + self.bias

    @classmethod
    def from_row(cls, row, bits=8, group_size=128, scheme="two_step"):
        """A copy of ``row``'s shard (a RowParallelLinear) with the quantized all-reduce."""
        return _copy_of(cls, row, bits=bits, group_size=group_size, scheme=scheme)

    def extra_repr(self):
        return super().extra_repr() + f", bits={self.bits}, group_size={self.group_size}, scheme={self.scheme}"


def row_modules(arch):
    """The names of a block's row-parallel modules in ``arch``'s plan: ['attn.o', 'mlp.proj']
    (or 'mlp.down' for SwiGLU), from gpt.arch.PLANS."""
    return [name.removeprefix("blocks.0.") for name in plan_modules(arch, ROWWISE, 1)]


def _replace(module, dotted, new):
    parent, _, leaf = dotted.rpartition(".")
    setattr(module.get_submodule(parent) if parent else module, leaf, new)


class SyncPointDropBlock(nn.Module):
    """Lesson 6's pre-norm block with the attention output's all-reduce dropped (Sync-Point
    Drop, Kim et al., ICML 2025, arXiv 2502.20727): rank r feeds its own MLP with its own heads'
    attention output only, and the one all-reduce of the block carries both partials.

        Y_r = attn_r(ln1(x)) @ W_o,r^T                   (B, T, H) Partial, no all-reduce
        Z_r = mlp_r(ln2(x + Y_r + b_o))                  (B, T, H) Partial: rank r's input only
        out = x + reduce(Y_r + Z_r) + b_o + b_mlp        (B, T, H) Replicated: one all-reduce

    In the ordinary block the MLP reads ln2(x + sum_j Y_j + b_o); that sum is the one thing SPD
    approximates, and after the block the residual stream is replicated and exact again. (The
    abstract names the attention output's synchronization; the block above is the notes' reading
    of the paper's Fig. 2, which this course did not read itself. Adding b_o to every rank's MLP
    input is the course's choice.) The function depends on t: which heads a rank holds decides Y_r.
    At t = 1 the block is the ordinary block.

    ``block``: a TP Block (gpt.model); its norms, attention and MLP are reused, their row layers
    replaced by PartialRowParallelLinear copies. ``reduce(group, x)``: the sum over the ranks
    (default the plain all-reduce; a quantized one composes).
    """

    def __init__(self, block, group, arch, reduce=None):
        super().__init__()
        self.group, self.reduce = group, reduce or all_reduce
        self.ln1, self.attn, self.ln2, self.mlp = block.ln1, block.attn, block.ln2, block.mlp
        self.row_names = row_modules(arch)                 # ['attn.o', 'mlp.proj' or 'mlp.down']
        for name in self.row_names:
            _replace(self, name, PartialRowParallelLinear.from_row(self.get_submodule(name)))

    def _bias(self, name):
        return self.get_submodule(name).bias

    def forward(self, x, cache=None):                      # x (B, T, H) Replicated
        y = self.attn(self.ln1(x), cache)                  # (B, T, H) Partial: this rank's heads
        b_o, b_mlp = (self._bias(name) for name in self.row_names)
        h = x + y if b_o is None else x + y + b_o          # rank-local: the sync point is dropped
        z = self.mlp(self.ln2(h))                          # (B, T, H) Partial
        out = x + self.reduce(self.group, y + z)           # the block's one all-reduce
        for b in (b_o, b_mlp):
            if b is not None:
                out = out + b
        return out


def quantized_reduce(bits, group_size=128, scheme="two_step"):
    """reduce(group, x) for SyncPointDropBlock: quantized.quantized_all_reduce with these settings."""
    check_quantization(bits, group_size, scheme)
    return functools.partial(quantized_all_reduce, bits=bits, group_size=group_size, scheme=scheme)
