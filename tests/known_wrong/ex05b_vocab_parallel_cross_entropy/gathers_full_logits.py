"""Known-wrong: all-gathers the full (N, V) logits and calls F.cross_entropy. The numbers are right;
the memory and traffic grow with the vocabulary, which is what vocab parallelism exists to avoid."""
from torch.nn import functional as F

from tp_from_scratch.nn.mappings import gather_from_tp_region


def vocab_parallel_cross_entropy(group, local_logits, target, ignore_index=-100, *, vocab_start=None):
    full = gather_from_tp_region(group, local_logits)  # (N.., V): exactly what must not happen
    return F.cross_entropy(full.reshape(-1, full.shape[-1]), target.reshape(-1), ignore_index=ignore_index)
