"""Known-wrong: the ignored positions are masked by writing 0 into the caller's target tensor.

The loss is right, but the caller's targets are now changed (a second loss on the same batch
would count the ignored positions as id 0).
"""
from tp_from_scratch.nn.mappings import all_reduce, reduce_from_tp_region


def vocab_parallel_cross_entropy(group, local_logits, target, ignore_index=-100, *, vocab_start=None):
    kept = target != ignore_index
    target[~kept] = 0  # wrong: writes into the caller's tensor
    m = all_reduce(group, local_logits.detach().max(-1).values, op="max")
    shifted = local_logits - m.unsqueeze(-1)
    local_target = target - vocab_start
    outside = (local_target < 0) | (local_target >= local_logits.shape[-1])
    picked = shifted.gather(-1, local_target.masked_fill(outside, 0).unsqueeze(-1)).squeeze(-1)
    target_logit = reduce_from_tp_region(group, picked.masked_fill(outside, 0.0))
    sum_exp = reduce_from_tp_region(group, shifted.exp().sum(-1))
    return (sum_exp.log() - target_logit).masked_fill(~kept, 0.0).sum() / kept.sum()
