"""The same GPT with PyTorch's own tensor parallelism (DTensor), for a side-by-side comparison.

    parallelize_module(gpt, tp_mesh, {
        "blocks.i.attn.q/k/v": ColwiseParallel(),   # W[out_t, in], like ColumnParallelLinear
        "blocks.i.attn.o":     RowwiseParallel(),   # W[out, in_t], like RowParallelLinear
        "blocks.i.mlp.fc":     ColwiseParallel(),
        "blocks.i.mlp.proj":   RowwiseParallel(),
    })

The attention code reads its head count off the tensor shapes, so after the q, k, v
weights become column shards it works on the local heads unchanged. The embeddings,
LayerNorms and the LM head stay replicated here (PyTorch can shard them too, with
loss_parallel; tp_from_scratch's own model shards the vocabulary, which is the one
difference in what the two versions compute).
"""
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def tp_plan(n_layers):
    """{module path: ColwiseParallel() or RowwiseParallel()} for every linear of every block."""
    plan = {}
    for i in range(n_layers):
        for name in ("attn.q", "attn.k", "attn.v", "mlp.fc"):
            plan[f"blocks.{i}.{name}"] = ColwiseParallel()
        for name in ("attn.o", "mlp.proj"):
            plan[f"blocks.{i}.{name}"] = RowwiseParallel()
    return plan


def parallelize_gpt(gpt, tp_mesh):
    """Shard a single-device GPT (every rank holding the same weights) over a 1-D DeviceMesh, in place.

    Forward per block: ColwiseParallel leaves each rank its heads / ffn columns; RowwiseParallel
    all-reduces the partial sums. Backward: the replicated input's gradient is all-reduced.
    """
    return parallelize_module(gpt, tp_mesh, tp_plan(gpt.config.n_layers))
