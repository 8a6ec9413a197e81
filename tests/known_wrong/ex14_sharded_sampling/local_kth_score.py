"""Known-wrong: top-k masks every score below this RANK's k-th largest, not the vocabulary's."""
import math

import torch

from tp_from_scratch.inference.sampling import (argmax_over_ranks, check_sampling, greedy_from_shards,  # noqa: F401
                                                gumbel_noise)


def sample_from_shards(group, local_logits, vocab_start, seed, position, temperature=1.0, top_k=0):
    check_sampling(temperature, top_k)
    if not (torch.is_tensor(local_logits) and local_logits.ndim == 2 and local_logits.is_floating_point()):
        raise ValueError("local_logits must be a 2-d float tensor")
    if not isinstance(vocab_start, int) or isinstance(vocab_start, bool) or vocab_start < 0:
        raise ValueError("vocab_start must be >= 0")
    scores = local_logits.to(torch.float32) / temperature
    B, n = scores.shape
    if top_k and n:
        kth = scores.topk(min(top_k, n), dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, -math.inf)
    keys = scores.double() + gumbel_noise(seed, position, B, vocab_start, n)
    return argmax_over_ranks(group, keys, vocab_start)
