"""Cross-entropy over vocabulary-parallel logits, without ever gathering the full logits.

Each rank holds logits for its block of the vocabulary, z_i (N, V/t) (N = B*T tokens).
The loss of one token with target y is  log sum_v exp(z_v) - z_y.  Three all-reduces of
N numbers each (instead of an all-gather of N*V) are enough:

    1. m = max over ranks of the local max              (all-reduce "max")
       shifting by m keeps exp() from overflowing; the loss does not change
    2. z_y - m: the rank owning y contributes it, the others 0   (all-reduce "sum")
    3. S = sum over ranks of sum_v exp(z_v - m)          (all-reduce "sum")

    loss = log S - (z_y - m), averaged over the targets that are not ignore_index,
    exactly what torch.nn.functional.cross_entropy computes.

The gradient needs no communication at all: d loss / d z_v = (softmax_v - [v == y]) / n,
and each rank has its own block of softmax = exp(z - m) / S.
"""
import torch

from tp_from_scratch.nn.mappings import all_gather, all_reduce, check_group, tp_rank


def vocab_start_of(group, local_vocab):
    """The first global vocabulary id of this rank's block: the sum of the lower ranks' sizes.

    Costs one all-gather of a single integer per rank; pass ``vocab_start`` to skip it.
    """
    sizes = all_gather(group, torch.tensor([local_vocab])).tolist()
    return sum(sizes[:tp_rank(group)])


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of vocab-sharded logits. forward: 3 all-reduces of N; backward: none."""

    @staticmethod
    def forward(ctx, group, local_logits, target, ignore_index, vocab_start):
        z = local_logits.detach()                      # (N.., V/t)
        local_vocab = z.shape[-1]
        # 1. the global max of every token's logits
        m = all_reduce(group, z.max(dim=-1).values, op="max")  # (N..)
        shifted = z - m.unsqueeze(-1)                  # (N.., V/t), all <= 0
        # 2. the target's shifted logit: only the rank that owns the target id has it
        local_target = target - vocab_start
        outside = (local_target < 0) | (local_target >= local_vocab)
        safe_target = local_target.masked_fill(outside, 0)     # any valid index; masked next
        target_logit = shifted.gather(-1, safe_target.unsqueeze(-1)).squeeze(-1)
        target_logit = all_reduce(group, target_logit.masked_fill(outside, 0.0))  # (N..)
        # 3. the softmax denominator, summed over the whole vocabulary
        exp = shifted.exp()
        sum_exp = all_reduce(group, exp.sum(dim=-1))   # (N..)
        loss = sum_exp.log() - target_logit            # (N..), replicated on every rank
        kept = target != ignore_index
        count = kept.sum()
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), safe_target, outside, kept, count)
        # a mean over zero targets is 0/0 = nan, as in F.cross_entropy
        return loss.masked_fill(~kept, 0.0).sum() / count

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, safe_target, outside, kept, count = ctx.saved_tensors
        grad = softmax.clone()                         # (N.., V/t)
        # minus one at the target, on the rank that owns it
        one_hot = torch.zeros_like(grad).scatter_(-1, safe_target.unsqueeze(-1), 1.0)
        grad -= one_hot * (~outside).unsqueeze(-1)
        grad *= kept.unsqueeze(-1) * (grad_loss / count)
        return None, grad, None, None, None


def vocab_parallel_cross_entropy(group, local_logits, target, ignore_index=-100, *,
                                 vocab_start=None):
    """F.cross_entropy(full_logits, target, ignore_index), from this rank's vocabulary block.

    local_logits: (..., V/t), this rank's logits for ids [vocab_start, vocab_start + V/t).
    target: (...) global ids, the same on every rank. Returns the mean loss (a scalar, the same
    on every rank). forward: all-reduce max + two all-reduce sums of (...) numbers; backward:
    no communication. vocab_start: None finds it from the ranks' block sizes (one tiny all-gather).
    """
    check_group(group)
    if target.shape != local_logits.shape[:-1]:
        raise ValueError(f"target shape {tuple(target.shape)} does not match the logits' leading "
                         f"shape {tuple(local_logits.shape[:-1])} on rank {tp_rank(group)}")
    if vocab_start is None:
        vocab_start = vocab_start_of(group, local_logits.shape[-1])
    return VocabParallelCrossEntropy.apply(group, local_logits, target, ignore_index, vocab_start)
