"""Known-wrong: top-k keeps exactly k ids (torch.topk's), dropping the others tied at the k-th
score, where the reference keeps every score equal to it."""
import math

import torch

from tp_from_scratch.inference.sampling import (argmax_over_ranks, check_sampling, greedy_from_shards,  # noqa: F401
                                                gumbel_noise)
from tp_from_scratch.nn.collectives import all_gather


def sample_from_shards(group, local_logits, vocab_start, seed, position, temperature=1.0, top_k=0):
    check_sampling(temperature, top_k)
    if not (torch.is_tensor(local_logits) and local_logits.ndim == 2 and local_logits.is_floating_point()):
        raise ValueError("local_logits must be a 2-d float tensor")
    if not isinstance(vocab_start, int) or isinstance(vocab_start, bool) or vocab_start < 0:
        raise ValueError("vocab_start must be >= 0")
    scores = local_logits.to(torch.float32) / temperature
    B, n = scores.shape
    if top_k:
        # the global top k as (score, id) pairs; only those ids stay
        local = scores.topk(min(top_k, n), dim=-1) if n else None
        values = local.values if n else scores.new_empty(B, 0)
        ids = (local.indices + vocab_start).float() if n else scores.new_empty(B, 0)
        pad = top_k - values.shape[1]
        values = torch.cat([values, scores.new_full((B, pad), -math.inf)], dim=1)
        ids = torch.cat([ids, scores.new_full((B, pad), -1.0)], dim=1)
        every = all_gather(group, torch.stack([values, ids], dim=-1), dim=1)   # (B, t k, 2)
        order = every[..., 0].argsort(dim=-1, descending=True, stable=True)[:, :top_k]
        kept = every[..., 1].gather(1, order)
        mine = torch.arange(vocab_start, vocab_start + n)[None, :]
        keep = (mine[:, :, None] == kept[:, None, :].long()).any(-1)
        scores = scores.masked_fill(~keep, -math.inf)
    keys = scores.double() + gumbel_noise(seed, position, B, vocab_start, n)
    return argmax_over_ranks(group, keys, vocab_start)
