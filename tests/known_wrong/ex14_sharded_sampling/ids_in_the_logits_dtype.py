"""Known-wrong: right everywhere except that greedy packs each rank's (maximum, id) pair in the
logits' own dtype. In bfloat16 an id above 256 (float16: above 2048) is rounded on the way, so
the winner's id comes back as a neighbour's: invisible on a toy vocabulary, wrong on any real one."""
import math

import torch

from tp_from_scratch.inference import sampling
from tp_from_scratch.nn.collectives import all_gather


def greedy_from_shards(group, local_logits, vocab_start):
    sampling._check_shard(local_logits, vocab_start)
    B, n = local_logits.shape
    if n:
        local = local_logits.argmax(dim=-1)
        best = local_logits.gather(1, local[:, None])
        ids = (local + vocab_start)[:, None].to(best.dtype)          # the bug: ids in the logits' dtype
    else:
        best = local_logits.new_full((B, 1), -math.inf)
        ids = local_logits.new_full((B, 1), math.inf)
    every = all_gather(group, torch.stack([best, ids], dim=-1), dim=1).double()
    keys, candidates = every[..., 0], every[..., 1]
    if torch.isnan(keys).any():
        raise ValueError("the logits hold NaN: no token can be chosen")
    top = keys.max(dim=1, keepdim=True).values
    return torch.where(keys == top, candidates, math.inf).min(dim=1).values.long()


sample_from_shards = sampling.sample_from_shards
