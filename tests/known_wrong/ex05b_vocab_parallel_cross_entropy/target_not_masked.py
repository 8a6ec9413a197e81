"""Known-wrong: the target's logit is picked on every rank (index clamped) and never masked, so the
all-reduce adds t logits instead of one."""
from tp_from_scratch.nn.mappings import all_reduce, reduce_from_tp_region


def vocab_parallel_cross_entropy(group, local_logits, target, ignore_index=-100, *, vocab_start=None):
    m = all_reduce(group, local_logits.detach().max(-1).values, op="max")
    shifted = local_logits - m.unsqueeze(-1)
    local_target = (target - vocab_start).clamp(0, local_logits.shape[-1] - 1)
    target_logit = reduce_from_tp_region(group, shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1))
    sum_exp = reduce_from_tp_region(group, shifted.exp().sum(-1))
    kept = target != ignore_index
    return (sum_exp.log() - target_logit).masked_fill(~kept, 0.0).sum() / kept.sum()
