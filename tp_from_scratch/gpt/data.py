"""Offline training data: token sequences from a seeded Markov chain (nothing is downloaded),
or, with data="text", bytes of the Python standard library's source (gpt/text.py).

A random but fixed transition matrix over V tokens gives every token a few likely
successors, so a small GPT has something to learn: its loss falls from ln(V) towards
the chain's entropy rate, the best loss any model can reach (printed by the lesson).

Batches are a pure function of (seed, step): a run resumed at step k sees exactly the
batches an uninterrupted run sees, with no iterator state to checkpoint, and every
data-parallel rank can cut its own rows out of the same global batch.
"""
from functools import lru_cache

import numpy as np
import torch


@lru_cache(maxsize=8)  # a pure function of its arguments; callers must not modify the result
def transition_matrix(vocab_size, seed, successors=4):
    """(V, V) row-stochastic matrix: each token moves to ``successors`` random tokens, unevenly."""
    rng = np.random.default_rng([seed, 1_000_003])
    probs = np.zeros((vocab_size, vocab_size))
    for token in range(vocab_size):
        nxt = rng.choice(vocab_size, size=min(successors, vocab_size), replace=False)
        probs[token, nxt] = rng.dirichlet(np.ones(len(nxt)))
    return probs


def entropy_rate(vocab_size, seed, successors=4):
    """The chain's entropy per token in nats: the loss of a perfect next-token predictor."""
    p = transition_matrix(vocab_size, seed, successors)
    # stationary distribution: left eigenvector of P for eigenvalue 1
    vals, vecs = np.linalg.eig(p.T)
    pi = np.real(vecs[:, np.argmin(np.abs(vals - 1))])
    pi = pi / pi.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        h_rows = -np.nansum(np.where(p > 0, p * np.log(p), 0.0), axis=1)
    return float(pi @ h_rows)


def global_batch(step, batch_size, seq_len, vocab_size, seed, data="markov", split="train"):
    """The whole step's batch: inputs and next-token targets, both (B, T) int64 tensors.

    Same (seed, step) -> same tokens, on every rank and in every run. ``data="text"``: bytes
    of the Python standard library's source (gpt/text.py; vocab_size must be 256), from the
    "train" or "val" split; the Markov chain has no split (every batch is fresh).
    """
    if data == "text":
        from tp_from_scratch.gpt.text import VOCAB_SIZE, text_batch
        if vocab_size != VOCAB_SIZE:
            raise ValueError(f"text data is bytes: vocab size must be {VOCAB_SIZE}, got {vocab_size}")
        return text_batch(step, batch_size, seq_len, seed, split)
    if data != "markov":
        raise ValueError(f"data must be 'markov' or 'text', got {data!r}")
    p = transition_matrix(vocab_size, seed)
    cdf = np.cumsum(p, axis=1)
    rng = np.random.default_rng([seed, step])
    tokens = np.empty((batch_size, seq_len + 1), dtype=np.int64)  # (B, T+1)
    tokens[:, 0] = rng.integers(0, vocab_size, size=batch_size)
    u = rng.random((batch_size, seq_len))
    for i in range(seq_len):
        row = cdf[tokens[:, i]]                                    # (B, V)
        # min(): guards against u landing above a row's last cdf value through rounding
        tokens[:, i + 1] = np.minimum((u[:, i:i + 1] > row).sum(axis=1), vocab_size - 1)
    tokens = torch.from_numpy(tokens)
    return tokens[:, :-1], tokens[:, 1:]


def local_batch(step, batch_size, seq_len, vocab_size, seed, dp_rank=0, dp_size=1, data="markov"):
    """This data-parallel rank's rows of the global batch: (B/dp, T) inputs and targets."""
    if batch_size % dp_size != 0:
        raise ValueError(f"batch size {batch_size} is not divisible by dp={dp_size}")
    x, y = global_batch(step, batch_size, seq_len, vocab_size, seed, data)
    rows = slice(dp_rank * batch_size // dp_size, (dp_rank + 1) * batch_size // dp_size)
    return x[rows], y[rows]
