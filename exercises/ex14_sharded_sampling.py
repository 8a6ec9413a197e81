"""Exercise 14: choose the next token from the vocabulary shards, without gathering the (B, V)
logits: greedy, temperature and top-k sampling (lessons/14_tp_inference.ipynb).

Replace each `raise NotImplementedError(...)` with your code, then run
    make grade            (or: .venv/bin/python -m pytest exercises -m ex14 -x)

Everything runs on ONE rank of t. `group` is that rank's communicator (the graders pass the
simulated ranks' Comm; a real run passes a torch ProcessGroup). `local_logits` (B, V_r) are the
logits of this rank's ids vocab_start .. vocab_start + V_r - 1 (V_r may be 0: a rank with no
ids). The library gives you:

    all_gather(group, x, dim)                    -> every rank's x concatenated along dim, in rank order
    gumbel_noise(seed, position, rows, start, n) -> (rows, n) float64 Gumbel noise of the ids
                                                    start .. start + n - 1: the same numbers on
                                                    every rank for the same ids, at every t

Both functions must return the SAME ids (B,) int64 on every rank, and the same ids as the
single-device reference on the gathered logits:

    greedy:   logits.argmax(-1)  (ties: the lowest id)
    sampling: scores = logits.to(float32) / temperature, every score below the k-th largest of
              the row set to -inf when top_k > 0 (scores equal to it are kept); then
              argmax(scores.double() + gumbel_noise(seed, position, B, 0, V)), ties to the lowest id

Exchange only candidates: one all-gather of (B, 1, 2) float64 [value, id] per choice, and for
top-k one all-gather of (B, k) float32 scores before it (the graders read the meter's bytes).
Raise a ValueError, on every rank and before any exchange, for temperature <= 0 or not finite,
top_k not a whole number >= 0, local_logits not a 2-d floating-point tensor, vocab_start not a
whole number >= 0. A NaN in any rank's logits: a ValueError on every rank (every rank must still
make the same exchanges, or the others would wait forever). Never modify local_logits.
"""
import torch  # noqa: F401

from tp_from_scratch.inference.sampling import gumbel_noise  # noqa: F401
from tp_from_scratch.nn.collectives import all_gather  # noqa: F401


def greedy_from_shards(group, local_logits, vocab_start):
    """(B,) int64: the argmax over the whole vocabulary of every row, ties to the lowest id."""
    raise NotImplementedError("Exercise 14 (greedy_from_shards): see lessons/14_tp_inference.ipynb")


def sample_from_shards(group, local_logits, vocab_start, seed, position, temperature=1.0, top_k=0):
    """(B,) int64: one sample per row from softmax(scores) over the whole vocabulary (Gumbel-max)."""
    raise NotImplementedError("Exercise 14 (sample_from_shards): see lessons/14_tp_inference.ipynb")
