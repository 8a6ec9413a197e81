"""tp_from_scratch.nn (and Lesson 7's sequence-parallel layers) described as an Adapter: the
implementation every other one is held against.

    .venv/bin/python -m tp_from_scratch.verify tp_from_scratch.verify.ours:ADAPTER
"""
from torch import nn
from torch.nn import functional as F

from tp_from_scratch.nn.cross_entropy import vocab_parallel_cross_entropy
from tp_from_scratch.nn.embedding import VocabParallelEmbedding
from tp_from_scratch.nn.linear import ColumnParallelLinear, RowParallelLinear
from tp_from_scratch.nn.mappings import (copy_to_tp_region, gather_from_tp_region,
                                         reduce_from_tp_region, scatter_to_tp_region)
from tp_from_scratch.sequence_parallel.nn import (column_linears_from_sequence,
                                                  gather_from_sequence_parallel_region,
                                                  reduce_scatter_to_sequence_parallel_region,
                                                  row_linear_to_sequence, sequence_parallel_layer_norm)
from tp_from_scratch.verify.adapter import FEATURES, Adapter

_CLASSES = {"column": ColumnParallelLinear, "row": RowParallelLinear}


def _default_init(group, kind, n_in, n_out, dtype):
    if kind == "embedding":  # n_in: V, n_out: H
        return VocabParallelEmbedding(n_in, n_out, group=group, dtype=dtype)
    return _CLASSES[kind](n_in, n_out, group=group, dtype=dtype)


ADAPTER = Adapter(
    name="tp_from_scratch.nn",
    column=lambda group, linear, gather_output=False: ColumnParallelLinear.from_linear(
        linear, group=group, gather_output=gather_output),
    row=lambda group, linear, input_is_parallel=True: RowParallelLinear.from_linear(
        linear, group=group, input_is_parallel=input_is_parallel),
    embedding=lambda group, embedding: VocabParallelEmbedding.from_embedding(embedding, group=group),
    f=copy_to_tp_region, g=reduce_from_tp_region, scatter=scatter_to_tp_region,
    gather=gather_from_tp_region,
    cross_entropy=lambda group, logits, target, ignore_index, vocab_start: vocab_parallel_cross_entropy(
        group, logits, target, ignore_index, vocab_start=vocab_start),
    default_init=_default_init,
    supports=FEATURES,
)


# --- Lesson 7: sequence parallelism ---------------------------------------------------------

class _SequenceParallelLayerNorm(nn.Module):
    """Lesson 7's LayerNorm on a sequence shard; weight and bias replicated (whole gradients)."""

    def __init__(self, group, norm):
        super().__init__()
        self.group, self.norm = group, norm

    weight = property(lambda self: self.norm.weight)
    bias = property(lambda self: self.norm.bias)

    def forward(self, x):                          # (B, T_r, H) -> (B, T_r, H)
        return sequence_parallel_layer_norm(self.group, x, self.norm)


class _SequenceParallelBlock(nn.Module):
    """verify.sp.Block with Lesson 7's layers: LN on the shard, one all-gather into fc1, the
    block's mix on the whole sequence, fc2 reduce-scattered back to the shard."""

    def __init__(self, group, block):
        super().__init__()
        self.group, self.ln, self.mix = group, block.ln, block.mix
        self.fc1 = ColumnParallelLinear.from_linear(block.fc1, group=group)
        self.fc2 = RowParallelLinear.from_linear(block.fc2, group=group)

    def forward(self, x, sizes=None):              # (B, T_r, H) -> (B, T_r, H); sizes: every T_r
        h = sequence_parallel_layer_norm(self.group, x, self.ln)
        (a,) = column_linears_from_sequence(self.group, h, [self.fc1], sizes)  # (B, T, FFN/t)
        return x + row_linear_to_sequence(self.group, self.mix(F.gelu(a)), self.fc2)


ADAPTER.sp_gather = gather_from_sequence_parallel_region
ADAPTER.sp_scatter = reduce_scatter_to_sequence_parallel_region
ADAPTER.sp_layernorm = _SequenceParallelLayerNorm
ADAPTER.sp_block = _SequenceParallelBlock
