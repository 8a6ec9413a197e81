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

A second set, one per kind of input the suite now feeds, each passing every
check it passed before and failing only the new one aimed at it:

    ROW_VIEW            flattens with .view(): fails on a non-contiguous input
    ROW_ALWAYS_BIAS     adds self.bias unconditionally: fails with bias=False
    COLUMN_PAD_TRIM     gather_output pads uneven blocks and trims from the wrong end
    COLUMN_OVERWRITES_GRAD  its backward sets weight.grad instead of adding to it: fails
                        the second of two forward+backward passes
    F_G_WORLD           f and g all-reduce over the whole world, not their group: right when
                        the TP group is the world, wrong in 2 groups of 2 on 4 processes
    COLUMN_SQUARE_ONLY  slices its rows with in_features (equal to out_features in every
                        fixed case): only the random shapes are not square
    SCATTER_POW2_MASK   finds its block with rank & (t - 1): right at t = 2 and 4, wrong at t = 3

and one per input variant of the sequence-parallel checks (dim 1 is T):

    SP_GATHER_PAD_TRIM  the SP all-gather pads uneven shards to the longest and trims the
                        padding from the end of the whole, not from each shard: wrong on uneven T
    SP_SCATTER_VIEW     the SP reduce-scatter flattens its input with .view(-1): fails on a
                        non-contiguous input
    SP_GATHER_3D_ONLY   the SP all-gather reshapes its output to (B, T, -1): wrong on 2-D and
                        4-D inputs (and on seed 3's 5-D random shape)
    SP_LAYERNORM_OVERWRITES_GRAD  the SP LayerNorm sets weight.grad and bias.grad (all-reduced)
                        instead of adding to them: fails the second of two passes

and the ones that misbehave across ranks; each must cost one named row, never the launch:

    HANGS_ON_RANK_1     g's rank 1 blocks forever (the 2-D input case, t = 3 only): a deadlock
    RAISES_ON_RANK_1    the row layer raises on rank 1 only, after its all-reduce (4-D input)
    SKIPS_COLLECTIVE    g's rank 1 skips the all-reduce (4-D input, t = 3 only); rank 0 waits
    tests/verify_rank1_import.py:ADAPTER   an adapter file that fails to import on rank 1

They call torch.distributed directly, as picotron does, so they run in processes only.
``exercise_adapter(module)`` describes an Exercise 5 implementation (a known-wrong one, say).

Issue 38's, each passing every check there was before it (contract 3):

    COLUMN_KEEPS_INPUT  keeps its input in a module attribute for dW (not in autograd's saved
                        tensors): right for forward, backward, forward, backward; wrong when two
                        forwards come before the backwards (weight tying, micro-batches)
    ROW_NO_GRAD_SKIPS_REDUCE  all-reduces only when autograd is on: right in training, partial
                        sums under torch.no_grad() (generation, evaluation)
    SP_BLOCK_REVERSED   its SP block gathers the ranks' positions in reversed order and its
                        reduce-scatter undoes the same order: invisible to a block that treats
                        each position alone, wrong once the block mixes positions
    (these three take our Comms: they run on simulated ranks)
    OUT_OF_STEP_ALWAYS  g's rank 1 makes one more collective, on a group of its own (nobody
                        waits): every g check ends out of step; it must cost --restarts fresh
                        starts, then only its own remaining rows
    GROUP_1_EXTRA_CALL  g makes one more all-reduce in the second TP group (ranks 2, 3) only: the
                        groups make different numbers of calls, each group in step with itself;
                        right values, and no fresh start
"""
import threading

import torch
import torch.distributed as dist
from torch.nn import functional as F

from tp_from_scratch.nn.embedding import VocabParallelEmbedding
from tp_from_scratch.nn.linear import ColumnParallelLinear, RowParallelLinear
from tp_from_scratch.nn.collectives import all_gather, reduce_scatter
from tp_from_scratch.nn.mappings import all_reduce, copy_to_tp_region, reduce_from_tp_region, tp_rank, tp_world_size
from tp_from_scratch.sequence_parallel.nn import sequence_parallel_layer_norm
from tp_from_scratch.sharding import shard_range, shard_sizes
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


# --- the inputs the suite feeds ------------------------------------------------------------

class _RowView(RowParallelLinear):
    def forward(self, x):
        flat = x.view(-1, x.shape[-1])  # the bug: view needs a contiguous x
        y = reduce_from_tp_region(self.group, F.linear(flat, self.weight)).reshape(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias


class _RowAlwaysBias(RowParallelLinear):
    def forward(self, x):
        y = reduce_from_tp_region(self.group, F.linear(x, self.weight))
        return y + self.bias  # the bug: None when built with bias=False


class _ColumnPadTrim(ColumnParallelLinear):
    def forward(self, x):
        y = F.linear(copy_to_tp_region(self.group, x), self.weight, self.bias)
        if not self.gather_output:
            return y
        size = max(self.output_sizes)
        padded = F.pad(y, (0, size - y.shape[-1]))   # padding at the end of each block...
        blocks = _AllGather.apply(self.group, padded).split(size, dim=-1)
        # ...the bug: trimmed from the front, which is right only for full blocks
        return torch.cat([b[..., size - n:] for b, n in zip(blocks, self.output_sizes)], dim=-1)


class _AllGather(torch.autograd.Function):
    """All-gather along the last dim; backward keeps this rank's block of the gradient."""

    @staticmethod
    def forward(ctx, group, x):
        ctx.group, ctx.size = group, x.shape[-1]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        rank = dist.get_rank(ctx.group)
        return None, grad[..., rank * ctx.size:(rank + 1) * ctx.size].contiguous()


class _LinearSettingGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.bias = bias
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dw = dy.reshape(-1, dy.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        weight.grad = dw  # the bug: overwrites what an earlier backward accumulated
        db = None if ctx.bias is None else dy.reshape(-1, dy.shape[-1]).sum(0)
        return dy @ weight, None, db


class _ColumnOverwritesGrad(ColumnParallelLinear):
    def forward(self, x):
        return _LinearSettingGrad.apply(copy_to_tp_region(self.group, x), self.weight, self.bias)


class _ColumnSquareOnly(ColumnParallelLinear):
    @classmethod
    def from_linear(cls, linear, *, group, gather_output=False):
        layer = super().from_linear(linear, group=group, gather_output=gather_output)
        t, rank = dist.get_world_size(group), dist.get_rank(group)
        n = linear.in_features  # the bug: the rows are output features
        lo, hi = rank * n // t, (rank + 1) * n // t
        with torch.no_grad():
            layer.weight = torch.nn.Parameter(linear.weight[lo:hi].clone())
            if linear.bias is not None:
                layer.bias = torch.nn.Parameter(linear.bias[lo:hi].clone())
        return layer


def _world_all_reduce(x):
    out = x.clone()
    dist.all_reduce(out)  # the bug: no group=, so the whole world
    return out


class _CopyWorld(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return _world_all_reduce(grad)


class _ReduceWorld(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _world_all_reduce(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class _ScatterPow2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x):
        t, rank = dist.get_world_size(group), dist.get_rank(group)
        size = x.shape[-1] // t
        block = rank & (t - 1)  # the bug: a power-of-two mask
        ctx.group, ctx.block, ctx.size = group, block, size
        return x[..., block * size:(block + 1) * size].clone()

    @staticmethod
    def backward(ctx, grad):
        return None, _AllGather.apply(ctx.group, grad.contiguous())


ROW_VIEW = Adapter(name="bug: row .view()", supports=NATIVE - {"scatter_input"},
                   row=lambda group, linear, input_is_parallel=True: _RowView.from_linear(linear, group=group))
ROW_ALWAYS_BIAS = Adapter(name="bug: row always adds bias", supports=NATIVE - {"scatter_input"},
                          row=lambda group, linear, input_is_parallel=True: _RowAlwaysBias.from_linear(
                              linear, group=group))
COLUMN_PAD_TRIM = Adapter(name="bug: column pad trimmed wrong", supports=NATIVE,
                          column=lambda group, linear, gather_output=False: _ColumnPadTrim.from_linear(
                              linear, group=group, gather_output=gather_output))
COLUMN_OVERWRITES_GRAD = Adapter(
    name="bug: column overwrites grad", supports=NATIVE - {"gather_output"},
    column=lambda group, linear, gather_output=False: _ColumnOverwritesGrad.from_linear(
        linear, group=group, gather_output=gather_output))
F_G_WORLD = Adapter(name="bug: f/g on the world", supports=NATIVE,
                    f=lambda group, x: _CopyWorld.apply(x), g=lambda group, x: _ReduceWorld.apply(x))
COLUMN_SQUARE_ONLY = Adapter(
    name="bug: column square only", supports=NATIVE - {"uneven", "gather_output"},
    column=lambda group, linear, gather_output=False: _ColumnSquareOnly.from_linear(linear, group=group))
SCATTER_POW2_MASK = Adapter(name="bug: scatter pow2 mask", supports=NATIVE - {"uneven"},
                            scatter=lambda group, x: _ScatterPow2.apply(group, x))

# --- sequence-parallel bugs ----------------------------------------------------------------

class _SPGatherPadTrim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x, sizes):
        rank, longest = dist.get_rank(group), max(sizes)
        ctx.group, ctx.lo, ctx.hi = group, sum(sizes[:rank]), sum(sizes[:rank + 1])
        padded = F.pad(x.movedim(1, -1), (0, longest - x.shape[1])).movedim(-1, 1).contiguous()
        whole = all_gather(group, padded, 1)                  # (B, t * longest, ...)
        return whole[:, :sum(sizes)].contiguous()             # the bug: the pads stay in the middle

    @staticmethod
    def backward(ctx, grad):
        return None, all_reduce(ctx.group, grad.contiguous())[:, ctx.lo:ctx.hi], None


class _SPReduceScatterView(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x):
        t, rank = dist.get_world_size(group), dist.get_rank(group)
        ctx.group, ctx.sizes = group, shard_sizes(x.shape[1], t)
        total = all_reduce(group, x.view(-1)).view(x.shape)   # the bug: .view needs contiguous x
        lo, hi = shard_range(x.shape[1], rank, t)
        return total[:, lo:hi].contiguous()

    @staticmethod
    def backward(ctx, grad):
        return None, all_gather(ctx.group, grad.contiguous(), 1, ctx.sizes)


class _SPGather3D(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x, sizes):
        ctx.group = group
        whole = all_gather(group, x.contiguous(), 1, sizes)
        return whole.view(whole.shape[0], whole.shape[1], -1)  # the bug: (B, T, H) assumed

    @staticmethod
    def backward(ctx, grad):
        return None, reduce_scatter(ctx.group, grad.contiguous(), 1), None


class _LayerNormSettingGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x, norm):
        ctx.group, ctx.norm = group, norm
        ctx.save_for_backward(x)
        return F.layer_norm(x, norm.normalized_shape, norm.weight.detach(), norm.bias.detach(), norm.eps)

    @staticmethod
    def backward(ctx, dy):
        x, = ctx.saved_tensors
        norm = ctx.norm
        with torch.enable_grad():
            leaves = [a.detach().requires_grad_() for a in (x, norm.weight, norm.bias)]
            y = F.layer_norm(leaves[0], norm.normalized_shape, leaves[1], leaves[2], norm.eps)
            dx, dw, db = torch.autograd.grad(y, leaves, dy)
        norm.weight.grad = all_reduce(ctx.group, dw)  # the bug: overwrites an earlier pass's
        norm.bias.grad = all_reduce(ctx.group, db)
        return None, dx, None


class _SPLayerNormOverwrites(torch.nn.Module):
    def __init__(self, group, norm):
        super().__init__()
        self.group, self.norm = group, norm

    weight = property(lambda self: self.norm.weight)
    bias = property(lambda self: self.norm.bias)

    def forward(self, x):
        return _LayerNormSettingGrad.apply(self.group, x, self.norm)


SP_GATHER_PAD_TRIM = Adapter(name="bug: sp gather pad trimmed wrong", supports=NATIVE,
                             sp_gather=lambda group, x, sizes=None: _SPGatherPadTrim.apply(
                                 group, x, sizes or [x.shape[1]] * dist.get_world_size(group)))
SP_SCATTER_VIEW = Adapter(name="bug: sp scatter .view()", supports=NATIVE,
                          sp_scatter=lambda group, x: _SPReduceScatterView.apply(group, x))
SP_GATHER_3D_ONLY = Adapter(name="bug: sp gather 3-D only", supports=NATIVE,
                            sp_gather=lambda group, x, sizes=None: _SPGather3D.apply(group, x, sizes))
SP_LAYERNORM_OVERWRITES_GRAD = Adapter(name="bug: sp layernorm overwrites grad", supports=NATIVE,
                                       sp_layernorm=_SPLayerNormOverwrites)


# which (component, check) each one must FAIL, and the launch that shows it ("t3": t = 3,
# "2of4": two TP groups of 2 on 4 processes)
INPUT_TARGETS = {
    "ROW_VIEW": ("row", "non-contiguous input", "t3"),
    "ROW_ALWAYS_BIAS": ("row", "bias=False", "t3"),
    "COLUMN_PAD_TRIM": ("column", "gather_output, uneven (13)", "t3"),
    "COLUMN_OVERWRITES_GRAD": ("column", "two passes (accumulate)", "t3"),
    "F_G_WORLD": ("g", "forward", "2of4"),
    "COLUMN_SQUARE_ONLY": ("column", "random shapes", "t3"),
    "SCATTER_POW2_MASK": ("scatter", "forward", "t3"),
    "SP_GATHER_PAD_TRIM": ("sp gather", "uneven T (13)", "t3"),
    "SP_SCATTER_VIEW": ("sp scatter", "non-contiguous input", "t3"),
    "SP_GATHER_3D_ONLY": ("sp gather", "4-D input", "t3"),
    "SP_LAYERNORM_OVERWRITES_GRAD": ("sp layernorm", "two passes (accumulate)", "t3"),
}


# --- misbehaving across ranks -------------------------------------------------------------

def _hangs_on_rank_1(group, x):
    if dist.get_world_size(group) == 3 and dist.get_rank(group) == 1 and x.shape == (6, 12):
        threading.Event().wait()  # the bug: blocks forever (a lock never released, say)
    return reduce_from_tp_region(group, x)


class _RowRaisesOnRank1(RowParallelLinear):
    def forward(self, x):
        y = super().forward(x)
        if dist.get_rank(self.group) == 1 and x.dim() == 4:
            raise ValueError("rank 1 cannot take a 4-D input")  # the bug: after the all-reduce
        return y


def _skips_on_rank_1(group, x):
    if dist.get_world_size(group) == 3 and dist.get_rank(group) == 1 and x.dim() == 4:
        return x.clone()  # the bug: rank 1 leaves out the all-reduce its peers wait in
    return reduce_from_tp_region(group, x)


HANGS_ON_RANK_1 = Adapter(name="bug: g hangs on rank 1", g=_hangs_on_rank_1, supports=NATIVE)
RAISES_ON_RANK_1 = Adapter(name="bug: row raises on rank 1", supports=NATIVE,
                           row=lambda group, linear, input_is_parallel=True: _RowRaisesOnRank1.from_linear(
                               linear, group=group, input_is_parallel=input_is_parallel))
SKIPS_COLLECTIVE = Adapter(name="bug: g skipped on rank 1", g=_skips_on_rank_1, supports=NATIVE)


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


# --- correct, but not Megatron's call pattern ---------------------------------------------

class _FusedCrossEntropy(torch.autograd.Function):
    """A correct vocab-parallel cross-entropy with two all-reduces, not Megatron's three: the
    max first, then the sum of exponentials and the target's logit stacked into one."""

    @staticmethod
    def forward(ctx, group, logits, target, ignore_index, vocab_start):
        z = logits.detach()                                             # (..., V/t)
        top = all_reduce(group, z.max(dim=-1).values, op="max")         # (...)
        shifted = z - top.unsqueeze(-1)
        mine = (target >= vocab_start) & (target < vocab_start + z.shape[-1])
        index = (target - vocab_start).clamp(0, z.shape[-1] - 1).unsqueeze(-1)
        picked = shifted.gather(-1, index).squeeze(-1) * mine
        sum_exp, target_logit = all_reduce(group, torch.stack([shifted.exp().sum(-1), picked]))
        kept = target != ignore_index
        count = kept.sum().clamp(min=1)
        ctx.save_for_backward(shifted.exp() / sum_exp.unsqueeze(-1), index, mine, kept)
        ctx.count = count
        return ((sum_exp.log() - target_logit) * kept).sum() / count

    @staticmethod
    def backward(ctx, grad):
        softmax, index, mine, kept = ctx.saved_tensors
        dz = softmax.clone()
        dz.scatter_add_(-1, index, -mine.unsqueeze(-1).to(dz.dtype))
        return None, dz * (kept.unsqueeze(-1) * grad / ctx.count), None, None, None


FUSED_CROSS_ENTROPY = Adapter(name="fused cross-entropy (correct)", supports=FEATURES,
                              cross_entropy=lambda group, z, target, ignore_index, vocab_start:
                              _FusedCrossEntropy.apply(group, z, target, ignore_index, vocab_start))


# --- issue 38: two forwards before the backwards, forwards without autograd, token order ------

class _KeepsInputLinear(torch.autograd.Function):
    """y = x W^T + b; dW from the module's attribute, not from the saved tensors (the bug)."""

    @staticmethod
    def forward(ctx, layer, x, weight, bias):
        ctx.layer, ctx.bias = layer, bias is not None
        ctx.save_for_backward(weight)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        weight, = ctx.saved_tensors
        x = ctx.layer.last_input                 # the bug: the LAST forward's input
        dw = dy.reshape(-1, dy.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        return None, dy @ weight, dw, dy.reshape(-1, dy.shape[-1]).sum(0) if ctx.bias else None


class _ColumnKeepsInput(ColumnParallelLinear):
    def forward(self, x):
        x = copy_to_tp_region(self.group, x)
        self.last_input = x.detach()
        return _KeepsInputLinear.apply(self, x, self.weight, self.bias)


class _RowNoGradSkipsReduce(RowParallelLinear):
    def forward(self, x):
        partial = F.linear(x, self.weight)
        y = reduce_from_tp_region(self.group, partial) if torch.is_grad_enabled() else partial  # the bug
        return y if self.bias is None else y + self.bias


def _offsets(sizes, order):
    """Where each rank's block starts when the blocks are laid out in ``order``."""
    start, out = 0, {}
    for r in order:
        out[r] = start
        start += sizes[r]
    return out


class _GatherReversed(torch.autograd.Function):
    """(B, T_r, ...) -> (B, T, ...) with the ranks' blocks in reversed order; backward the sum's
    block at the same place."""

    @staticmethod
    def forward(ctx, group, x, sizes):
        t, rank = tp_world_size(group), tp_rank(group)
        order = list(reversed(range(t)))
        ctx.group, ctx.lo, ctx.n = group, _offsets(sizes, order)[rank], sizes[rank]
        parts = all_gather(group, x.contiguous(), 1, sizes).split(sizes, dim=1)
        return torch.cat([parts[r] for r in order], dim=1)

    @staticmethod
    def backward(ctx, grad):
        total = all_reduce(ctx.group, grad.contiguous())
        return None, total[:, ctx.lo:ctx.lo + ctx.n].contiguous(), None


class _ReduceScatterReversed(torch.autograd.Function):
    """(B, T, ...) partial, blocks in reversed order -> this rank's block of the sum."""

    @staticmethod
    def forward(ctx, group, x, sizes):
        t, rank = tp_world_size(group), tp_rank(group)
        order = list(reversed(range(t)))
        ctx.group, ctx.sizes, ctx.order = group, sizes, order
        lo = _offsets(sizes, order)[rank]
        return all_reduce(group, x.contiguous())[:, lo:lo + sizes[rank]].contiguous()

    @staticmethod
    def backward(ctx, grad):
        parts = all_gather(ctx.group, grad.contiguous(), 1, ctx.sizes).split(ctx.sizes, dim=1)
        return None, torch.cat([parts[r] for r in ctx.order], dim=1), None


class _SPBlockReversed(torch.nn.Module):
    def __init__(self, group, block):
        super().__init__()
        self.group, self.ln = group, block.ln
        self.mix = getattr(block, "mix", torch.nn.Identity())   # (a block of contract 2 had none)
        self.fc1 = ColumnParallelLinear.from_linear(block.fc1, group=group)
        self.fc2 = RowParallelLinear.from_linear(block.fc2, group=group)

    def forward(self, x, sizes=None):             # (B, T_r, H) -> (B, T_r, H)
        sizes = sizes or [x.shape[1]] * tp_world_size(self.group)
        h = _GatherReversed.apply(self.group, sequence_parallel_layer_norm(self.group, x, self.ln), sizes)
        a = self.mix(F.gelu(F.linear(h, self.fc1.weight, self.fc1.bias)))
        y = _ReduceScatterReversed.apply(self.group, F.linear(a, self.fc2.weight), sizes)
        return x + y + copy_to_tp_region(self.group, self.fc2.bias)


COLUMN_KEEPS_INPUT = Adapter(name="bug: column keeps its input", supports=set(FEATURES) - {"gather_output"},
                             column=lambda group, linear, gather_output=False: _ColumnKeepsInput.from_linear(
                                 linear, group=group))
ROW_NO_GRAD_SKIPS_REDUCE = Adapter(
    name="bug: row reduces only with grad", supports=set(FEATURES) - {"scatter_input"},
    row=lambda group, linear, input_is_parallel=True: _RowNoGradSkipsReduce.from_linear(linear, group=group))
SP_BLOCK_REVERSED = Adapter(name="bug: sp block gathers reversed", supports=FEATURES, sp_block=_SPBlockReversed)

# which (component, check) each one must FAIL, on simulated ranks
MODE_TARGETS = {
    "COLUMN_KEEPS_INPUT": ("column", "two forwards, then backwards"),
    "ROW_NO_GRAD_SKIPS_REDUCE": ("row", "no_grad / inference_mode forward"),
    "SP_BLOCK_REVERSED": ("sp block", "token order"),
}


# --- out of step: every check, or in one TP group only -----------------------------------

_SOLO = {}


def _solo_groups(group):
    """A group of each rank alone (new_group is collective over the world: every rank makes all)."""
    _SOLO["groups"] = [dist.new_group([r]) for r in range(dist.get_world_size())]


def _extra_on_rank_1(group, x):
    if dist.get_rank(group) == 1:   # the bug: one more collective, on a group of its own
        dist.all_reduce(torch.zeros(1), group=_SOLO["groups"][dist.get_rank()])
    return reduce_from_tp_region(group, x)


def _extra_in_group_1(group, x):
    if dist.get_rank() >= 2:        # the second TP group syncs a statistic; the first does not
        dist.all_reduce(torch.zeros(1), group=group)
    return reduce_from_tp_region(group, x)


OUT_OF_STEP_ALWAYS = Adapter(name="bug: g out of step on rank 1", g=_extra_on_rank_1, setup=_solo_groups,
                             supports=NATIVE)
GROUP_1_EXTRA_CALL = Adapter(name="g with an extra call in group 1 (correct)", g=_extra_in_group_1,
                             supports=NATIVE)
