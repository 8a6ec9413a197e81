"""Known-wrong: the softmax denominator is summed over this rank's vocabulary block only, so each
rank's loss is a loss over its own block, never all-reduced into the full one."""
from tp_from_scratch.nn.mappings import all_reduce, reduce_from_tp_region


def vocab_parallel_cross_entropy(group, local_logits, target, ignore_index=-100, *, vocab_start=None):
    m = all_reduce(group, local_logits.detach().max(-1).values, op="max")
    shifted = local_logits - m.unsqueeze(-1)
    local_target = target - vocab_start
    outside = (local_target < 0) | (local_target >= local_logits.shape[-1])
    picked = shifted.gather(-1, local_target.masked_fill(outside, 0).unsqueeze(-1)).squeeze(-1)
    target_logit = reduce_from_tp_region(group, picked.masked_fill(outside, 0.0))
    sum_exp = shifted.exp().sum(-1)  # missing: the all-reduce over the ranks
    kept = target != ignore_index
    return (sum_exp.log() - target_logit).masked_fill(~kept, 0.0).sum() / kept.sum()
