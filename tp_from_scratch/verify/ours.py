"""tp_from_scratch.nn described as an Adapter: the implementation every other one is held against.

    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.verify tp_from_scratch.verify.ours:ADAPTER
"""
from tp_from_scratch.nn.cross_entropy import vocab_parallel_cross_entropy
from tp_from_scratch.nn.embedding import VocabParallelEmbedding
from tp_from_scratch.nn.linear import ColumnParallelLinear, RowParallelLinear
from tp_from_scratch.nn.mappings import (copy_to_tp_region, gather_from_tp_region,
                                         reduce_from_tp_region, scatter_to_tp_region)
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
