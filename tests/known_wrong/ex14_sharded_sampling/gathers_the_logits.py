"""Known-wrong: the right ids, the old way: every rank all-gathers the (B, V/t) logits and picks
from the whole vocabulary (the bytes the exercise is about saving)."""
import torch

from tp_from_scratch.inference.sampling import check_sampling, sample_gathered
from tp_from_scratch.nn.collectives import all_gather


def _gather(group, local_logits, vocab_start):
    if not (torch.is_tensor(local_logits) and local_logits.ndim == 2 and local_logits.is_floating_point()):
        raise ValueError("local_logits must be a 2-d float tensor")
    if not isinstance(vocab_start, int) or isinstance(vocab_start, bool) or vocab_start < 0:
        raise ValueError("vocab_start must be >= 0")
    logits = all_gather(group, local_logits.contiguous(), dim=-1)
    if torch.isnan(logits).any():
        raise ValueError("NaN in the logits")
    return logits


def greedy_from_shards(group, local_logits, vocab_start):
    return _gather(group, local_logits, vocab_start).argmax(dim=-1)


def sample_from_shards(group, local_logits, vocab_start, seed, position, temperature=1.0, top_k=0):
    check_sampling(temperature, top_k)
    return sample_gathered(_gather(group, local_logits, vocab_start), seed, position, temperature, top_k)
