"""Known-wrong: among ranks holding the same maximum, the HIGHEST id wins (torch.argmax keeps the lowest)."""
import math

import torch

from tp_from_scratch.inference.sampling import check_sampling, gumbel_noise, kth_largest_from_shards
from tp_from_scratch.nn.collectives import all_gather


def _argmax_over_ranks(group, values, start):
    B, n = values.shape
    if n:
        local = values.argmax(dim=-1)
        best, ids = values.gather(1, local[:, None]).double(), (local + start)[:, None].double()
    else:
        best, ids = torch.full((B, 1), -math.inf, dtype=torch.float64), torch.full((B, 1), -1.0, dtype=torch.float64)
    every = all_gather(group, torch.stack([best, ids], dim=-1), dim=1)
    keys, candidates = every[..., 0], every[..., 1]
    if torch.isnan(keys).any():
        raise ValueError("NaN in the logits")
    top = keys.max(dim=1, keepdim=True).values
    return torch.where(keys == top, candidates, -math.inf).max(dim=1).values.long()


def _check(local_logits, vocab_start):
    if not (torch.is_tensor(local_logits) and local_logits.ndim == 2 and local_logits.is_floating_point()):
        raise ValueError("local_logits must be a 2-d float tensor")
    if not isinstance(vocab_start, int) or isinstance(vocab_start, bool) or vocab_start < 0:
        raise ValueError("vocab_start must be >= 0")


def greedy_from_shards(group, local_logits, vocab_start):
    _check(local_logits, vocab_start)
    return _argmax_over_ranks(group, local_logits, vocab_start)


def sample_from_shards(group, local_logits, vocab_start, seed, position, temperature=1.0, top_k=0):
    check_sampling(temperature, top_k)
    _check(local_logits, vocab_start)
    scores = local_logits.to(torch.float32) / temperature
    if top_k:
        scores = scores.masked_fill(scores < kth_largest_from_shards(group, scores, top_k), -math.inf)
    keys = scores.double() + gumbel_noise(seed, position, scores.shape[0], vocab_start, scores.shape[1])
    return _argmax_over_ranks(group, keys, vocab_start)
