"""The vocab-parallel cross-entropy with its one order-dependent sum made t-invariant.

Lesson 5's vocab_parallel_cross_entropy needs three all-reduces of N numbers (nn/cross_entropy.py):
the max (exact in any order), the target's logit (one rank holds it, the others add 0: exact in
any order) and the softmax denominator S = sum_v exp(z_v - m), a sum over the vocabulary, which
t splits. Only that one changes here: each rank sums exp over each of its vocabulary leaves (V/L
contiguous ids, a sum over a contiguous axis of the same length at every t), then the fixed tree
adds the L leaf sums. log S, the loss and the gradient (softmax - one-hot, element-wise on each
rank's block, no communication) then have the same bits at every t that divides L.
"""
import torch

from tp_from_scratch.nn.mappings import all_reduce, check_group, tp_rank, tp_world_size
from tp_from_scratch.numerics.reduction import tree_all_reduce
from tp_from_scratch.numerics.tree import DEFAULT_LEAVES, check_leaves


class InvariantVocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of vocab-sharded logits. forward: all-reduce max, all-reduce of the target
    logit, the fixed tree over vocabulary leaves for S; backward: none."""

    @staticmethod
    def forward(ctx, group, local_logits, target, ignore_index, vocab_start, leaves):
        z = local_logits.detach()                              # (N, V/t)
        m = all_reduce(group, z.max(dim=-1).values, op="max")  # (N,): exact in any order
        shifted = z - m.unsqueeze(-1)
        local_target = target - vocab_start
        outside = (local_target < 0) | (local_target >= z.shape[-1])
        safe_target = local_target.masked_fill(outside, 0)
        target_logit = shifted.gather(-1, safe_target.unsqueeze(-1)).squeeze(-1)
        target_logit = all_reduce(group, target_logit.masked_fill(outside, 0.0))  # one term, t-1 zeros
        exp = shifted.exp()
        here = leaves // tp_world_size(group)
        per_leaf = exp.reshape(z.shape[0], here, -1).sum(-1)   # (N, L/t): each leaf's V/L ids
        sum_exp = tree_all_reduce(group, per_leaf.t().contiguous(), leaves)  # (N,), the fixed tree
        loss = sum_exp.log() - target_logit
        kept = target != ignore_index
        count = kept.sum()
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), safe_target, outside, kept, count)
        return loss.masked_fill(~kept, 0.0).sum() / count

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, safe_target, outside, kept, count = ctx.saved_tensors
        grad = softmax.clone()                                 # (N, V/t)
        one_hot = torch.zeros_like(grad).scatter_(-1, safe_target.unsqueeze(-1), 1.0)
        grad -= one_hot * (~outside).unsqueeze(-1)
        grad *= kept.unsqueeze(-1) * (grad_loss / count)
        return None, grad, None, None, None, None


def invariant_vocab_parallel_cross_entropy(group, local_logits, target, ignore_index=-100, *, vocab_start,
                                           leaves=DEFAULT_LEAVES):
    """F.cross_entropy(full_logits, target, ignore_index) from this rank's vocabulary block, with the
    same bits at every t that divides ``leaves``.

    local_logits (N, V/t): ids [vocab_start, vocab_start + V/t), V/t a whole number of leaves
    (V divisible by leaves); target (N,) global ids, the same on every rank. Returns the mean
    loss, a scalar, the same on every rank.
    """
    check_group(group)
    t, rank = tp_world_size(group), tp_rank(group)
    check_leaves(leaves, t)
    if local_logits.ndim != 2 or target.shape != local_logits.shape[:1]:
        raise ValueError(f"rank {rank}: logits {tuple(local_logits.shape)} and target {tuple(target.shape)}: "
                         f"expected (N, V/t) and (N,)")
    if local_logits.shape[-1] % (leaves // t):
        raise ValueError(f"rank {rank}: {local_logits.shape[-1]} vocabulary ids do not cut into this rank's "
                         f"{leaves // t} leaves of the tree of {leaves}: V must be divisible by {leaves}")
    return InvariantVocabParallelCrossEntropy.apply(group, local_logits, target, ignore_index, vocab_start, leaves)
