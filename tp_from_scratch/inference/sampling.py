"""Choosing the next token from the vocabulary shards: greedy, temperature and top-k, without
gathering the (B, V) logits.

The LM head is vocabulary-parallel (Lesson 5): rank r holds the logits of its ids
[vocab_start, vocab_start + V_r), Sharded(vocab). Lesson 6's gpt.generate all-gathers them to
(B, V) on every rank and picks there. Here each rank picks its own best candidate and the ranks
exchange one (key, id) pair per sequence, so a token costs 16 B bytes per rank-to-rank step
instead of V/t numbers per sequence:

    greedy_from_shards(group, local_logits, vocab_start)             argmax, ties to the lowest id
    sample_from_shards(group, local_logits, vocab_start, seed, position, temperature, top_k)
    sample_gathered(logits, seed, position, temperature, top_k)      the single-device reference
    shard_picker(sample, seed, temperature, top_k)                   gpt.generate's pick= hook

Sampling is the Gumbel-max trick: with G_v independent standard Gumbel noise,
argmax_v (s_v + G_v) is distributed as softmax(s) (Gumbel 1954; e.g. Maddison, Tarlow and Minka,
"A* Sampling", NeurIPS 2014, section 2). A maximum splits over ranks exactly: the largest key is
the largest of the ranks' largest keys. The noise G_v is a function of (seed, position, row, id)
alone (a counter-based generator, ``gumbel_noise``), so every rank draws the same numbers for the
same ids without any exchange, and the draws do not depend on t. The ids are then IDENTICAL to
``sample_gathered`` at every t, not just equal in distribution.

How this relates to gpt.generate's sampler today: its ``choose`` runs torch.multinomial's
algorithm, the exponential race argmax_v p_v / E_v with E_v ~ Exp(1) from one sequential
generator (the draws of transformers' generate). Since -log E_v is a standard Gumbel variable,
the race IS Gumbel-max on log p_v = s_v - logsumexp(s): the same distribution over tokens. The
numbers differ (a counter-based draw per (position, row, id) instead of the next B V draws of a
generator), so a sequence sampled here differs from one sampled there with the same seed.

Top-k needs the k-th largest score of the whole vocabulary: each rank sends its own k largest
(B, k), every rank takes the k-th largest of the t k candidates (the global k-th: each of the
global top k is in its rank's local top k), and masks every score below it, as
gpt.generate.sampling_scores does (ties at the k-th value are all kept).

Collectives per token on ``group`` (a ProcessGroup or a Comm): one all-gather of (B, 1, 2)
float64 candidates, and for top-k one all-gather of (B, k) float32 scores before it
(``sharded_sampling_bytes``). Every rank makes the same calls whatever its data, so a bad value
on one rank (NaN) is found by all of them after the exchange, and none waits forever.
"""
import math

import numpy as np
import torch

from tp_from_scratch.gpt.generate import sampling_scores
from tp_from_scratch.nn.collectives import all_gather
from tp_from_scratch.sharding import shard_sizes

# ---------------------------------------------------------------------------------------
# The random numbers: a function of (seed, position, row, id), the same on every rank
# ---------------------------------------------------------------------------------------

_WORD = 2 ** 64 - 1
_GOLDEN = 0x9E3779B97F4A7C15  # 2^64 / golden ratio, odd: v -> v * _GOLDEN is a bijection mod 2^64


def _mix64(x):
    """SplitMix64's finalizer (Steele, Lea and Flood, "Fast splittable pseudorandom number
    generators", OOPSLA 2014): a bijection of uint64 words in which every input bit flips
    about half the output bits. numpy's uint64 arithmetic wraps modulo 2^64, as it must here."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def gumbel_noise(seed, position, rows, vocab_start, count):
    """Standard Gumbel noise (rows, count), float64, for the ids vocab_start .. vocab_start + count - 1.

    Entry (b, j) depends only on (seed, position, b, vocab_start + j): a counter-based generator
    (hash the coordinates, as GPU samplers do with Philox), so a rank that draws its own ids gets
    exactly the numbers a single device draws for them. u = (h + 1/2) / 2^53 from the top 53 bits
    of the hash lies in (0, 1), so G = -log(-log u) is finite (between -3.7 and 37.5).
    """
    with np.errstate(over="ignore"):  # the multiplications wrap modulo 2^64 on purpose
        base = _mix64(np.array([seed & _WORD], dtype=np.uint64))
        base = _mix64(base ^ np.uint64(position & _WORD))
        per_row = _mix64(base ^ np.arange(rows, dtype=np.uint64))                       # (B,)
        ids = np.arange(vocab_start, vocab_start + count, dtype=np.uint64) * np.uint64(_GOLDEN)
        h = _mix64(per_row[:, None] ^ ids[None, :])                                    # (B, n)
    u = ((h >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53
    return torch.from_numpy(-np.log(-np.log(u)))


# ---------------------------------------------------------------------------------------
# The single-device reference
# ---------------------------------------------------------------------------------------

def sample_gathered(logits, seed, position, temperature=1.0, top_k=0):
    """Next ids (B,) from the full logits (B, V): argmax_v (scores_v + G_v), ties to the lowest id.

    scores = gpt.generate.sampling_scores(logits, temperature, top_k): float32 logits / temperature,
    -inf below the k-th largest. G = gumbel_noise(seed, position, B, 0, V). A sample from
    softmax(scores), the distribution gpt.generate's ``choose`` samples from.
    """
    check_sampling(temperature, top_k)
    scores = sampling_scores(logits, temperature, top_k)                                 # (B, V)
    keys = scores.double() + gumbel_noise(seed, position, logits.shape[0], 0, logits.shape[1])
    return keys.argmax(dim=-1)


def check_sampling(temperature, top_k):
    """A ValueError naming temperature (must be > 0) or top_k (0 = off, else >= 1)."""
    if not (isinstance(temperature, (int, float)) and temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number above 0, got {temperature!r}")
    if not isinstance(top_k, (int, np.integer)) or isinstance(top_k, bool) or top_k < 0:
        raise ValueError(f"top_k must be a whole number >= 0 (0: no top-k), got {top_k!r}")


def _check_shard(local_logits, vocab_start):
    if not (torch.is_tensor(local_logits) and local_logits.ndim == 2 and local_logits.is_floating_point()):
        got = f"a {local_logits.ndim}-d {local_logits.dtype} tensor" if torch.is_tensor(local_logits) else type(local_logits)
        raise ValueError(f"local_logits must be a (B, V/t) floating-point tensor, got {got}")
    if not isinstance(vocab_start, (int, np.integer)) or isinstance(vocab_start, bool) or vocab_start < 0:
        raise ValueError(f"vocab_start must be a whole number >= 0 (this rank's first id), got {vocab_start!r}")


# ---------------------------------------------------------------------------------------
# From the shards
# ---------------------------------------------------------------------------------------

def argmax_over_ranks(group, values, vocab_start):
    """Global ids (B,) of the largest entry of every row, over all ranks' (B, V_r) ``values``;
    ties go to the lowest id, as torch.argmax breaks them on the gathered row.

    Each rank sends its row maxima and their first ids as (B, 1, 2) float64 (every float dtype
    and every id below 2^53 is exact there); one all-gather. A rank with no ids (V_r = 0) sends
    (-inf, +inf): it loses every comparison, ties included. A NaN anywhere: ValueError on every rank.
    """
    B, n = values.shape
    if n:
        local = values.argmax(dim=-1)                                                   # (B,) first max
        best = values.gather(1, local[:, None]).double()                                # (B, 1)
        ids = (local + vocab_start)[:, None].double()
    else:
        best = torch.full((B, 1), -math.inf, dtype=torch.float64)
        ids = torch.full((B, 1), math.inf, dtype=torch.float64)
    every = all_gather(group, torch.stack([best, ids], dim=-1), dim=1)                 # (B, t, 2)
    keys, candidates = every[..., 0], every[..., 1]
    if torch.isnan(keys).any():
        raise ValueError("the logits hold NaN: no token can be chosen")
    top = keys.max(dim=1, keepdim=True).values                                         # (B, 1)
    # among the ranks holding the maximum, the lowest id (an empty rank's +inf never wins)
    return torch.where(keys == top, candidates, math.inf).min(dim=1).values.long()


def greedy_from_shards(group, local_logits, vocab_start):
    """The argmax over the whole vocabulary of each row, from this rank's (B, V_r) logits of ids
    vocab_start ..: (B,) int64, identical on every rank and to ``logits.argmax(-1)`` on the
    gathered (B, V). One all-gather of (B, 1, 2) float64 (``argmax_over_ranks``)."""
    _check_shard(local_logits, vocab_start)
    return argmax_over_ranks(group, local_logits, vocab_start)


def kth_largest_from_shards(group, scores, k):
    """(B, 1): the k-th largest entry of every row over all ranks' (B, V_r) float32 ``scores``
    (the smallest when the vocabulary has fewer than k ids). One all-gather of (B, k) float32.

    Each rank sends its k largest, -inf padded when V_r < k: the global top k are among the
    t k values sent, and padding never rises above a real value."""
    B, n = scores.shape
    local = scores.topk(min(k, n), dim=-1).values if n else scores.new_empty(B, 0)     # (B, <= k)
    padded = torch.cat([local, scores.new_full((B, k - local.shape[1]), -math.inf)], dim=1)
    every = all_gather(group, padded, dim=1)                                           # (B, t k)
    return every.topk(k, dim=-1).values[:, -1:]


def sample_from_shards(group, local_logits, vocab_start, seed, position, temperature=1.0, top_k=0):
    """A sample per row from softmax(scores) over the whole vocabulary, from this rank's (B, V_r)
    logits of ids vocab_start ..: (B,) int64, identical on every rank and to
    ``sample_gathered(gathered logits, seed, position, temperature, top_k)`` at every t.

    scores = float32 logits / temperature (as gpt.generate.sampling_scores); with top_k, every
    score below the global k-th largest is -inf (``kth_largest_from_shards``); keys = scores +
    gumbel_noise of this rank's ids; then ``argmax_over_ranks``. ``local_logits`` is not modified.
    """
    check_sampling(temperature, top_k)
    _check_shard(local_logits, vocab_start)
    B, n = local_logits.shape
    scores = local_logits.to(torch.float32) / temperature                              # (B, V_r) float32
    if top_k:
        scores = scores.masked_fill(scores < kth_largest_from_shards(group, scores, top_k), -math.inf)
    keys = scores.double() + gumbel_noise(seed, position, B, vocab_start, n)
    return argmax_over_ranks(group, keys, vocab_start)


def shard_picker(sample=False, seed=0, temperature=1.0, top_k=0):
    """A ``pick`` for gpt.generate.generate: each new token chosen from this rank's vocabulary
    shard (greedy_from_shards, or sample_from_shards at position = the new token's index), no
    (B, V) gather. On one device (group None) the gathered reference: argmax, sample_gathered.
    The ids equal the single-device ones at every t; sampled ones differ from gpt.generate's
    own ``choose`` (other random numbers, the same distribution)."""
    check_sampling(temperature, top_k)

    def pick(group, local_logits, vocab_start, position):
        if group is None:
            return sample_gathered(local_logits, seed, position, temperature, top_k) if sample \
                else local_logits.argmax(dim=-1)
        if sample:
            return sample_from_shards(group, local_logits, vocab_start, seed, position, temperature, top_k)
        return greedy_from_shards(group, local_logits, vocab_start)
    return pick


# ---------------------------------------------------------------------------------------
# Bytes per token on the ring all-gather (collectives.all_gather: every shard but the next rank's)
# ---------------------------------------------------------------------------------------

def sharded_sampling_bytes(batch, t, top_k=0):
    """Bytes one rank sends to choose B tokens from the shards: (t-1) B 16 for the (key, id)
    pairs in float64, plus (t-1) B k 4 for top-k's float32 scores. The same on every rank."""
    return (t - 1) * batch * (2 * 8 + (4 * top_k if top_k else 0))


def gathered_sampling_bytes(batch, vocab_size, t, rank, itemsize):
    """Bytes rank ``rank`` sends when gpt.generate all-gathers the (B, V/t) logits: every shard
    but rank r+1's (ring all-gather), B (V - V_{r+1}) itemsize; 0 at t = 1."""
    if t == 1:
        return 0
    return batch * itemsize * (vocab_size - shard_sizes(vocab_size, t)[(rank + 1) % t])


def exchanges(top_k=0):
    """How many all-gathers one token choice makes from the shards: 1, or 2 with top-k."""
    return 2 if top_k else 1
