"""A vocabulary-parallel embedding (Megatron-LM): each rank holds a block of the table's rows.

    table E[V_t, H]: rank i holds rows [start_i, stop_i) of the (V, H) embedding table
    ids (B, T), Replicated
      -> rows this rank owns: E_i[id - start_i]; other ids: 0      (B, T, H), Partial
      -g (all-reduce)->  exactly one rank contributed each row     (B, T, H), Replicated

The all-reduce adds one real row and t-1 zeros, so the result is bit-exact. In backward
g is the identity and the mask keeps each rank's gradient on its own rows.
Vocabulary sizes that t does not divide split like numpy.array_split.
"""
import torch
from torch import nn
from torch.nn import functional as F

from tp_from_scratch.nn.mappings import reduce_from_tp_region_, tp_rank, tp_world_size
from tp_from_scratch.sharding import shard_range, shard_sizes


class VocabParallelEmbedding(nn.Module):
    """E[ids] with the (V, H) table split by rows over the TP group.

    forward: local lookup of the ids in [vocab_start, vocab_stop), zeros elsewhere, then g
    (all-reduce). backward: identity through g; the table's gradient lands on this rank's rows.
    Local weight (V/t, H) (uneven V: the first V % t ranks hold one row more).
    """

    def __init__(self, num_embeddings, embedding_dim, *, group, padding_idx=None, dtype=None,
                 device=None, init=True):
        super().__init__()
        self.group = group
        # a global id whose row gets no gradient (nn.Embedding's padding_idx); only the rank
        # that owns that row applies it, at the row's LOCAL index
        self.padding_idx = padding_idx
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        t, rank = tp_world_size(group), tp_rank(group)
        self.vocab_sizes = shard_sizes(num_embeddings, t)
        self.vocab_start, self.vocab_stop = shard_range(num_embeddings, rank, t)
        local_vocab = self.vocab_stop - self.vocab_start
        self.weight = nn.Parameter(torch.empty(local_vocab, embedding_dim, dtype=dtype, device=device))
        if init:
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        """Draw the full table like nn.Embedding (N(0, 1), same default RNG on every rank), keep our rows."""
        full = torch.empty(self.num_embeddings, self.embedding_dim,
                           dtype=self.weight.dtype, device=self.weight.device)
        nn.init.normal_(full)
        self.weight.copy_(full[self.vocab_start:self.vocab_stop])

    @classmethod
    def from_embedding(cls, embedding, *, group):
        """This rank's block of rows of a single-device torch.nn.Embedding (a copy)."""
        w = embedding.weight
        layer = cls(embedding.num_embeddings, embedding.embedding_dim, group=group,
                    padding_idx=embedding.padding_idx, dtype=w.dtype, device=w.device, init=False)
        with torch.no_grad():
            layer.weight.copy_(w[layer.vocab_start:layer.vocab_stop])
        return layer

    def forward(self, ids):
        # ids: (B, T) global token ids, the same on every rank
        outside = (ids < self.vocab_start) | (ids >= self.vocab_stop)
        local_ids = (ids - self.vocab_start).masked_fill(outside, 0)  # any valid row; zeroed below
        local_padding = None
        if self.padding_idx is not None and self.vocab_start <= self.padding_idx < self.vocab_stop:
            local_padding = self.padding_idx - self.vocab_start
        rows = F.embedding(local_ids, self.weight, local_padding)     # (B, T, H)
        rows = rows.masked_fill(outside.unsqueeze(-1), 0.0)           # (B, T, H), Partial
        return reduce_from_tp_region_(self.group, rows)               # (B, T, H), Replicated (in place)

    def extra_repr(self):
        return (f"{self.num_embeddings}, {self.embedding_dim}, "
                f"local rows [{self.vocab_start}, {self.vocab_stop})")
