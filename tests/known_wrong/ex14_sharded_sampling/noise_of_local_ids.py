"""Known-wrong: the noise is drawn for the LOCAL ids 0 .. V_r - 1, so each rank reuses rank 0's
numbers and the draws depend on t."""
import math

import torch

from tp_from_scratch.inference.sampling import (argmax_over_ranks, check_sampling, greedy_from_shards,  # noqa: F401
                                                gumbel_noise, kth_largest_from_shards)


def sample_from_shards(group, local_logits, vocab_start, seed, position, temperature=1.0, top_k=0):
    check_sampling(temperature, top_k)
    if not (torch.is_tensor(local_logits) and local_logits.ndim == 2 and local_logits.is_floating_point()):
        raise ValueError("local_logits must be a 2-d float tensor")
    if not isinstance(vocab_start, int) or isinstance(vocab_start, bool) or vocab_start < 0:
        raise ValueError("vocab_start must be >= 0")
    scores = local_logits.to(torch.float32) / temperature
    if top_k:
        scores = scores.masked_fill(scores < kth_largest_from_shards(group, scores, top_k), -math.inf)
    keys = scores.double() + gumbel_noise(seed, position, scores.shape[0], 0, scores.shape[1])
    return argmax_over_ranks(group, keys, vocab_start)
