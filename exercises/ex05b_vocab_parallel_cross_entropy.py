"""Exercise 5b: cross-entropy over vocabulary-parallel logits, without gathering them
(lessons/05_autograd_tensor_parallel.ipynb).

Replace the `raise NotImplementedError(...)` with your code, then run
    make grade            (or: .venv/bin/python -m pytest exercises -m ex05b -x)

The LM head is column-parallel over the vocabulary: rank r holds the logits of the ids
[vocab_start, vocab_start + V_r), a block of the last dim. Gathering the full (N, V)
logits would cost more memory and traffic than the rest of the model's activations; the
graders read the meter and fail any implementation whose traffic grows with V.

What you may use (tensor collectives on `group`, which comes first as everywhere in the
course; new tensors, inputs never modified):

    all_reduce(group, x, op="sum" | "max")   not differentiable (treat its result as a constant)
    reduce_from_tp_region(group, x)          g: a differentiable all-reduce sum (backward: identity)
    tp_rank(group), tp_world_size(group)

Either write a torch.autograd.Function with your own backward (the gradient is
(softmax - one_hot(target)) / n and needs no communication), or build the loss from
differentiable torch operations and reduce_from_tp_region and let autograd do the rest.
Think about what happens to exp(z) when a logit is 1000, about targets that live on
another rank, and about which partial results must be summed over the ranks.
"""
import torch  # noqa: F401
from torch.nn import functional as F  # noqa: F401

from tp_from_scratch.nn.mappings import all_reduce, reduce_from_tp_region, tp_rank, tp_world_size  # noqa: F401


def vocab_parallel_cross_entropy(group, local_logits, target, ignore_index=-100, *, vocab_start=None):
    """The mean cross-entropy F.cross_entropy(full_logits, target, ignore_index=ignore_index).

    local_logits: (N.., V_r), this rank's block of the logits (ids vocab_start .. vocab_start+V_r-1).
    target: (N..), global ids, the same on every rank; entries equal to ignore_index do not count.
    vocab_start: the first id of this rank's block (the graders always pass it).
    Return a scalar tensor, the same on every rank, whose gradient w.r.t. local_logits is this
    rank's block of the single-device gradient. Do not modify local_logits or target.
    """
    raise NotImplementedError("Exercise 5b (vocab_parallel_cross_entropy): see lessons/05_autograd_tensor_parallel.ipynb")
