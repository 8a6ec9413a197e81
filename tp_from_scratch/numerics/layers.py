"""TP-invariant layers: Lesson 5's column- and row-parallel linears with every reduction that t
splits done over fixed leaves and every sliced dimension computed slice-invariantly.

Each is a drop-in for its style of the sharding plan (gpt.arch): the same constructor, the same
parameters and state dict as nn.ColumnParallelLinear / nn.RowParallelLinear (they subclass them),
only forward and backward differ:

    InvariantColumnParallelLinear   W[out_t, in]: Y_i = X W_i^T + b_i (invariant_linear, no BLAS
                                    on the sliced out axis). backward: dW_i, db_i invariantly;
                                    dX = sum over the out axis, split by t: one BLAS product per
                                    leaf of out/L rows, then tree_all_reduce (its own f; there
                                    is no shared f: see below). With replicas = r (KV heads,
                                    nkv < t) the r ranks holding one head first add their dY in
                                    rank order (the order of the GQA group's sum at t = 1), and
                                    each feeds the tree only its own L/t leaves.
    InvariantRowParallelLinear      W[out, in_t]: Y = sum over the in axis, split by t: one BLAS
                                    product per leaf of in/L columns, tree_all_reduce, + b once.
                                    backward: dX_i, dW_i invariantly (no communication).
    invariant_lm_head               logits_i = h E_i^T, the column layer's Function on the
                                    vocabulary shard: dh is a tree over vocabulary leaves.

Why no shared f: q, k and v (and SwiGLU's gate and up) read one input. Lesson 5 lets a single f
sum their three partial dX on each rank, then all-reduce once. Here each layer's dX is summed
over the ranks in the fixed tree first, and autograd then adds the three (replicated) results
in the graph's order, the same at every t. The layers therefore refuse input_is_copied=True;
a caller must not apply f around them.

``check_invariant(config, t, leaves)`` names the first size of a GPTConfig the fixed tree cannot
serve at t. Also measured (Lesson 13): the element-wise SiLU and tanh-GELU kernels may give other
bits for a tensor's last (count mod step) elements, which ATen's vectorized_loop hands to a scalar
loop (step: two vectors, 16 float32 with AVX2, 32 with AVX512; measure.elementwise_step), so an
MLP's activation is t-invariant when B*T*F/t is a multiple of the step at every t (B*T a
multiple of 32 is enough).
"""
import torch

from tp_from_scratch.gpt.arch import COLWISE, KV_COLWISE, ROWWISE, VOCAB_PARALLEL
from tp_from_scratch.nn import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from tp_from_scratch.nn.mappings import all_gather, scatter_to_tp_region, tp_rank, tp_world_size
from tp_from_scratch.numerics.matmul import invariant_linear, leaf_products
from tp_from_scratch.numerics.reduction import tree_all_reduce
from tp_from_scratch.numerics.tree import DEFAULT_LEAVES, check_leaves


def _check_divides(size, leaves, what, rank):
    if size % leaves:
        raise ValueError(f"rank {rank}: {what} {size} is not divisible by the {leaves} leaves of the fixed "
                         f"reduction tree")


def sum_over_replica_ranks(group, dy, replicas):
    """dY of a KV head held by ``replicas`` neighbouring ranks -> the sum of their dY, in rank order.

    One all-gather over the group (every rank's dY, exact copies), then each rank adds its head's
    replicas left to right: ((dY_0 + dY_1) + dY_2) + ... The GQA group's gradient at t = 1 is
    that sum too (repeat_interleave's backward adds the group's heads one after the other), so
    when each replica holds one query head, the sums agree bit for bit.
    """
    rank = tp_rank(group)
    pieces = all_gather(group, dy.unsqueeze(0), 0)       # (t, ...): rank order
    first = rank - rank % replicas
    total = pieces[first]
    for k in range(first + 1, first + replicas):
        total = total + pieces[k]
    return total


class InvariantColumnLinearFunction(torch.autograd.Function):
    """forward: Y_i = X W_i^T + b_i (invariant_linear); backward: dW_i, db_i invariantly, dX by
    the fixed tree over out-axis leaves (an all-reduce: this layer's own f)."""

    @staticmethod
    def forward(ctx, group, x, weight, bias, leaves, replicas):
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.leaves, ctx.replicas, ctx.has_bias = group, leaves, replicas, bias is not None
        return invariant_linear(x, weight, bias)          # (..., out_local), Sharded(-1)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        group, leaves, replicas = ctx.group, ctx.leaves, ctx.replicas
        t, rank = tp_world_size(group), tp_rank(group)
        if replicas > 1:
            dy = sum_over_replica_ranks(group, dy, replicas)
        dy2, x2 = dy.reshape(-1, weight.shape[0]), x.reshape(-1, weight.shape[1])  # (M, out_local), (M, in)
        dw = invariant_linear(dy2.t(), x2.t())           # (out_local, in): a sum over the M tokens
        db = dy2.t().contiguous().sum(-1) if ctx.has_bias else None  # over contiguous M: invariant
        # this rank's own leaves of the out axis: all it holds, or its 1/r of a replicated head
        own = weight.shape[0] // replicas
        start = (rank % replicas) * own
        partials = leaf_products(dy2[:, start:start + own], weight[start:start + own], leaves // t)  # (L/t, M, in)
        dx = tree_all_reduce(group, partials, leaves).reshape(x.shape)  # (..., in), Replicated
        return None, dx, dw, db, None, None


class InvariantRowLinearFunction(torch.autograd.Function):
    """forward: Y = sum over in-axis leaves of X_leaf W_leaf^T by the fixed tree (an all-reduce,
    Megatron's g); backward: dX_i and dW_i invariantly, no communication (g's backward is the identity)."""

    @staticmethod
    def forward(ctx, group, x, weight, leaves):
        ctx.save_for_backward(x, weight)
        partials = leaf_products(x, weight.t(), leaves // tp_world_size(group))  # (L/t, M, out), Partial
        y = tree_all_reduce(group, partials, leaves)     # (M, out), Replicated
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dy2, x2 = dy.reshape(-1, weight.shape[0]), x.reshape(-1, weight.shape[1])  # (M, out), (M, in/t)
        dx = invariant_linear(dy2, weight.t()).reshape(x.shape)  # (..., in/t): a sum over out
        dw = invariant_linear(dy2.t(), x2.t())           # (out, in/t): a sum over the M tokens
        return None, dx, dw, None


class InvariantColumnParallelLinear(ColumnParallelLinear):
    """ColumnParallelLinear (W[out_t, in]) whose outputs and gradients have the same bits at every
    t that divides ``leaves``. forward: invariant Y_i, no communication; backward: dX by the fixed
    tree (its own f: input_is_copied and gather_output are refused)."""

    def __init__(self, in_features, out_features, bias=True, gather_output=False, *, group,
                 input_is_copied=False, replicas=1, leaves=DEFAULT_LEAVES, dtype=None, device=None, init=True):
        t, rank = tp_world_size(group), tp_rank(group)
        check_leaves(leaves, t)
        _check_divides(out_features, leaves, "out_features", rank)
        if gather_output:
            raise ValueError(f"rank {rank}: InvariantColumnParallelLinear keeps its output Sharded; "
                             "gather_output is not supported")
        if input_is_copied:
            raise ValueError(f"rank {rank}: InvariantColumnParallelLinear sums its input gradient itself, "
                             "over the fixed tree; a shared f (input_is_copied=True) would add q, k and v's "
                             "partial dX in a rank-dependent order: build it with input_is_copied=False")
        super().__init__(in_features, out_features, bias, False, group=group, replicas=replicas,
                         dtype=dtype, device=device, init=init)
        self.leaves = leaves

    @classmethod
    def from_linear(cls, linear, *, group, replicas=1, leaves=DEFAULT_LEAVES):
        """This rank's shard of a single-device torch.nn.Linear (a copy), as nn's from_linear cuts it."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, group=group,
                    replicas=replicas, leaves=leaves, dtype=linear.weight.dtype, device=linear.weight.device,
                    init=False)
        layer.load_state_dict(ColumnParallelLinear.from_linear(linear, group=group, replicas=replicas).state_dict())
        return layer

    def forward(self, x):
        # x (..., in), Replicated -> (..., out/t) Sharded(-1); dX summed over the ranks by the tree
        return InvariantColumnLinearFunction.apply(self.group, x, self.weight, self.bias, self.leaves, self.replicas)


class InvariantRowParallelLinear(RowParallelLinear):
    """RowParallelLinear (W[out, in_t]) whose outputs and gradients have the same bits at every t
    that divides ``leaves``. forward: the fixed tree over in-axis leaves, then + b once;
    backward: no communication (with input_is_parallel=False, the scatter's all-gather of dX)."""

    def __init__(self, in_features, out_features, bias=True, input_is_parallel=True, *, group,
                 leaves=DEFAULT_LEAVES, dtype=None, device=None, init=True):
        t, rank = tp_world_size(group), tp_rank(group)
        check_leaves(leaves, t)
        _check_divides(in_features, leaves, "in_features", rank)
        super().__init__(in_features, out_features, bias, input_is_parallel, group=group, dtype=dtype,
                         device=device, init=init)
        self.leaves = leaves

    @classmethod
    def from_linear(cls, linear, *, group, input_is_parallel=True, leaves=DEFAULT_LEAVES):
        """This rank's shard of a single-device torch.nn.Linear (a copy), as nn's from_linear cuts it."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, input_is_parallel,
                    group=group, leaves=leaves, dtype=linear.weight.dtype, device=linear.weight.device, init=False)
        layer.load_state_dict(RowParallelLinear.from_linear(linear, group=group).state_dict())
        return layer

    def forward(self, x):
        if not self.input_is_parallel:
            x = scatter_to_tp_region(self.group, x, self.input_sizes)  # (..., in/t); backward all-gathers
        y = InvariantRowLinearFunction.apply(self.group, x, self.weight, self.leaves)  # (..., out), Replicated
        return y if self.bias is None else y + self.bias  # after the sum: added once


def invariant_lm_head(group, h, weight, vocab_size, leaves=DEFAULT_LEAVES):
    """logits_i = h E_i^T: this rank's vocabulary block of the logits, the same bits at every t.

    h (..., H) Replicated; weight (V/t, H), the rank's rows of the (tied or untied) head.
    forward: invariant_linear, no communication; backward: dE_i invariantly, dh by the fixed tree
    over vocabulary leaves (f). Every rank must hold whole leaves: V divisible by ``leaves``.
    """
    t, rank = tp_world_size(group), tp_rank(group)
    check_leaves(leaves, t)
    _check_divides(vocab_size, leaves, "vocab size", rank)
    if weight.shape[0] != vocab_size // t:
        raise ValueError(f"rank {rank}: the head's {weight.shape[0]} vocabulary rows are not this rank's "
                         f"{vocab_size // t} of V = {vocab_size} at tp={t}")
    return InvariantColumnLinearFunction.apply(group, h, weight, None, leaves, 1)


# style of the sharding plan (gpt.arch) -> the layer that implements it TP-invariantly. The
# embedding needs no change: its all-reduce adds one row and t-1 zeros, exact in any order.
# The head and the loss are functions: invariant_lm_head, invariant_vocab_parallel_cross_entropy.
INVARIANT_STYLES = {
    COLWISE: InvariantColumnParallelLinear,
    KV_COLWISE: InvariantColumnParallelLinear,
    ROWWISE: InvariantRowParallelLinear,
    VOCAB_PARALLEL: VocabParallelEmbedding,
}


def check_invariant(config, t, leaves=DEFAULT_LEAVES):
    """Raise a ValueError naming the first size of ``config`` (a GPTConfig) the fixed tree of
    ``leaves`` leaves cannot serve at t ranks; None when every layer can be invariant."""
    config.validate(t)
    config.check_even(t, "the fixed reduction tree's layers (every rank whole subtrees)")
    check_leaves(leaves, t)
    for what, size in [("hidden size", config.hidden), ("ffn size", config.ffn), ("vocab size", config.vocab_size),
                       ("n_kv_heads * head size", config.n_kv_heads * config.head_size)]:
        if size % leaves:
            raise ValueError(f"{what} {size} is not divisible by the {leaves} leaves of the fixed reduction tree")
    if config.n_kv_heads < t:
        replicas = t // config.n_kv_heads
        if config.n_heads != t:
            raise ValueError(f"n_kv_heads {config.n_kv_heads} < tp={t} puts each KV head on {replicas} ranks holding "
                             f"{config.n_heads // t} query heads each: their partial KV gradients cannot be added in "
                             f"t = 1's order; the invariant layers need n_kv_heads >= tp or one query head per rank "
                             f"(n_heads = tp)")
        if config.position == "rope":
            raise ValueError(f"n_kv_heads {config.n_kv_heads} < tp={t} with RoPE: each of a KV head's {replicas} "
                             f"ranks turns its own partial dK back through RoPE before the replicas are added, "
                             f"which t = 1 does after; the invariant layers need n_kv_heads >= tp for RoPE")
