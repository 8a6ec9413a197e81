"""The sequence-parallel mappings and layers in torch: autograd Functions, group first.

The numpy pair of ``sequence_parallel.mappings`` becomes two autograd Functions (the paper's
g and g-bar; Megatron-LM's names), plus a scatter that enters the sequence-parallel region
after the embedding:

    gather_from_sequence_parallel_region(group, x)        forward all-gather(T),  backward reduce-scatter(T)
    reduce_scatter_to_sequence_parallel_region(group, x)  forward reduce-scatter(T), backward all-gather(T)
    scatter_to_sequence_parallel_region(group, x)         forward keep my positions, backward all-gather(T)

and the layers, as functions of the tensor-parallel layers' own parameters (so a sequence-
parallel model holds exactly the TP model's modules, names and shards):

    sequence_parallel_layer_norm(group, x, norm)          LayerNorm on (B, T_r, H); its weight and
                                                          bias pass through f, so their Partial
                                                          gradients are all-reduced
    column_linears_from_sequence(group, x, layers)        one all-gather feeds several column layers
                                                          (q, k, v); saves only the shard
    row_linear_to_sequence(group, x, layer)               row layer whose output is reduce-scattered

As in ``tp_from_scratch.nn``, ``group`` is a torch ProcessGroup (native collectives) or a
tp_from_scratch Comm (the from-scratch ring collectives, e.g. run_spmd's simulated ranks).
Sequence shards follow the numpy.array_split rule; ``sizes`` (every rank's length) is needed
for an uneven split on a ProcessGroup, whose all-gather wants equal pieces.
"""
import torch
from torch.nn import functional as F

from tp_from_scratch.nn.collectives import all_gather, check_group, reduce_scatter, split, tp_rank, tp_world_size
from tp_from_scratch.nn.mappings import copy_to_tp_region, sum_over_replicas
from tp_from_scratch.sharding import shard_sizes

SEQUENCE_DIM = 1  # activations are (B, T, H)


def _gather(group, x, sizes):
    """all_gather along T, checking that this rank's shard fits the array_split rule."""
    t, rank = tp_world_size(group), tp_rank(group)
    sizes = sizes or [x.shape[SEQUENCE_DIM]] * t
    if len(sizes) != t or x.shape[SEQUENCE_DIM] != shard_sizes(sum(sizes), t)[rank] \
            or list(sizes) != shard_sizes(sum(sizes), t):
        raise ValueError(f"rank {rank}: sequence shard of length {x.shape[SEQUENCE_DIM]} with shard "
                         f"sizes {list(sizes)}; splitting T={sum(sizes)} over t={t} ranks gives "
                         f"{shard_sizes(sum(sizes), t)} (array_split rule)")
    return all_gather(group, x, SEQUENCE_DIM, list(sizes))


class GatherFromSequenceParallelRegion(torch.autograd.Function):
    """The paper's g. forward: all-gather along T (Sharded(1) -> Replicated); backward: reduce-scatter."""

    @staticmethod
    def forward(ctx, group, x, sizes=None):
        ctx.group = group
        return _gather(group, x, sizes)

    @staticmethod
    def backward(ctx, grad):
        # every rank used every position: each holds a Partial gradient, and needs its positions' sum
        return None, reduce_scatter(ctx.group, grad, SEQUENCE_DIM), None


class ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """The paper's g-bar. forward: reduce-scatter along T (Partial -> Sharded(1)); backward: all-gather."""

    @staticmethod
    def forward(ctx, group, x):
        ctx.group, ctx.sizes = group, shard_sizes(x.shape[SEQUENCE_DIM], tp_world_size(group))
        return reduce_scatter(group, x, SEQUENCE_DIM)

    @staticmethod
    def backward(ctx, grad):
        return None, _gather(ctx.group, grad, ctx.sizes)


class ScatterToSequenceParallelRegion(torch.autograd.Function):
    """Enter the region: forward keeps this rank's positions (Replicated -> Sharded(1)); backward all-gathers."""

    @staticmethod
    def forward(ctx, group, x):
        ctx.group, ctx.sizes = group, shard_sizes(x.shape[SEQUENCE_DIM], tp_world_size(group))
        return split(group, x, SEQUENCE_DIM)

    @staticmethod
    def backward(ctx, grad):
        return None, _gather(ctx.group, grad, ctx.sizes)


def gather_from_sequence_parallel_region(group, x, sizes=None):
    """g: (B, T_r, H) -> (B, T, H), every rank's positions in rank order; backward reduce-scatters.

    sizes: every rank's T_r (array_split of T); None means equal shards.
    """
    return GatherFromSequenceParallelRegion.apply(check_group(group), x, sizes)


def reduce_scatter_to_sequence_parallel_region(group, x):
    """g-bar: (B, T, H) Partial -> (B, T_r, H), this rank's positions of the sum; backward all-gathers."""
    return ReduceScatterToSequenceParallelRegion.apply(check_group(group), x)


def scatter_to_sequence_parallel_region(group, x):
    """(B, T, H) Replicated -> (B, T_r, H), no communication; backward all-gathers the gradient."""
    return ScatterToSequenceParallelRegion.apply(check_group(group), x)


# ---------------------------------------------------------------------------------------
# Layers, as functions of the tensor-parallel modules' parameters
# ---------------------------------------------------------------------------------------

def sequence_parallel_layer_norm(group, x, norm):
    """``norm`` (an nn.LayerNorm or nn.RMSNorm, Replicated weights) on this rank's positions x (B, T_r, H).

    Its weight (and bias) enter through f (identity forward): each rank's gradient covers only
    its positions, so it is Partial, and f's backward all-reduces it (Megatron-LM all-reduces
    the same gradients, coalesced, in finalize_model_grads).
    """
    weight = copy_to_tp_region(group, norm.weight)
    if isinstance(norm, torch.nn.RMSNorm):
        return F.rms_norm(x, norm.normalized_shape, weight, norm.eps)
    bias = None if norm.bias is None else copy_to_tp_region(group, norm.bias)
    return F.layer_norm(x, norm.normalized_shape, weight, bias, norm.eps)


class ColumnLinearsFromSequence(torch.autograd.Function):
    """All-gather x along T once, apply several column-parallel linears; save only the shard.

    forward: x_r (B, T_r, H) --all-gather--> x (B, T, H) --> x @ W_j^T + b_j for each layer j.
    backward: all-gather x again (Korthikanti et al. §4.2.2: keep the 1/t shard, not the
    gathered copy, and pay one more all-gather), dW_j = dY_j^T x, dx = sum_j dY_j W_j
    (Partial) --reduce-scatter--> dx_r. With save_gathered=True the gathered x is kept instead
    (no backward all-gather, t times the memory for this tensor).
    """

    @staticmethod
    def forward(ctx, group, sizes, save_gathered, x_shard, *weights_and_biases):
        ctx.group, ctx.sizes, ctx.save_gathered = group, sizes, save_gathered
        x = _gather(group, x_shard, sizes)                          # (B, T, H)
        pairs = list(zip(weights_and_biases[0::2], weights_and_biases[1::2]))
        ctx.has_bias = [b is not None for _, b in pairs]
        ctx.save_for_backward(x if save_gathered else x_shard, *[w for w, _ in pairs])
        return tuple(F.linear(x, w, b) for w, b in pairs)           # each (B, T, out_j/t)

    @staticmethod
    def backward(ctx, *grads):
        saved, *weights = ctx.saved_tensors
        x = saved if ctx.save_gathered else _gather(ctx.group, saved, ctx.sizes)  # (B, T, H)
        x2 = x.reshape(-1, x.shape[-1])
        dx = sum(g @ w for g, w in zip(grads, weights))             # (B, T, H) Partial
        out = []
        for g, has_bias in zip(grads, ctx.has_bias):
            g2 = g.reshape(-1, g.shape[-1])
            out += [g2.t() @ x2, g2.sum(0) if has_bias else None]
        return (None, None, None, reduce_scatter(ctx.group, dx, SEQUENCE_DIM), *out)


def column_linears_from_sequence(group, x_shard, layers, sizes=None, save_gathered=False):
    """[layer(all_gather_T(x_shard)) for layer in layers], with one all-gather forward and one
    reduce-scatter (plus, unless save_gathered, one all-gather) backward.

    layers: ColumnParallelLinear modules (their weight (out/t, H) and bias); x_shard (B, T_r, H).
    Returns a tuple of (B, T, out_j/t) tensors, Sharded(-1).
    """
    params = []
    for layer in layers:  # a KV head held by several ranks: its copies' gradients are summed
        replicas = getattr(layer, "replicas", 1)
        params += [sum_over_replicas(group, layer.weight, replicas),
                   None if layer.bias is None else sum_over_replicas(group, layer.bias, replicas)]
    return ColumnLinearsFromSequence.apply(check_group(group), sizes, save_gathered, x_shard, *params)


def row_linear_to_sequence(group, x_local, layer):
    """y_r = reduce_scatter_T(x_i @ W_i^T) + f(b): a RowParallelLinear's parameters, output Sharded(1).

    x_local (B, T, in/t) Sharded(-1) -> (B, T_r, out). The bias is added to this rank's positions
    only, so its gradient is Partial: f all-reduces it in backward.
    """
    y = reduce_scatter_to_sequence_parallel_region(group, F.linear(x_local, layer.weight))
    return y if layer.bias is None else y + copy_to_tp_region(group, layer.bias)
