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


# ---------------------------------------------------------------------------------------
# The same vocabulary sharding as ours (Lesson 9's fair race): embedding and LM head split by V
# ---------------------------------------------------------------------------------------

def vocab_plan(config):
    """tp_plan plus the vocabulary sharded like tp_from_scratch's model.

        wte      RowwiseParallel(input_layouts=Replicate())  E[V_t, H]: local lookup, masked,
                                                               all-reduce (ours: VocabParallelEmbedding)
        ln_f     PrepareModuleOutput(-> Replicate DTensor)   the head's input as a Replicate DTensor
        lm_head  ColwiseParallel()                           (untied only) W[V_t, H], Shard(0)
    GPT.forward computes the head as F.linear(ln_f(x), head weight) (the tied wte.weight or
    lm_head.weight, both Shard(0)): a Replicate input times a Shard(0) weight gives Shard(-1)
    logits (B, T, V/t), as ColwiseParallel would. The loss must then run under loss_parallel()
    (forward and backward): see loss_context.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleOutput

    plan = tp_plan(config.n_layers)
    plan["wte"] = RowwiseParallel(input_layouts=Replicate())
    # backward: the Replicate DTensor's gradient arrives Partial and is all-reduced (our f)
    plan["ln_f"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Replicate(),
                                       use_local_output=False)
    if not config.tie_embeddings:  # forward never calls lm_head: the style only shards its weight
        plan["lm_head"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    return plan


def parallelize_gpt_vocab(gpt, tp_mesh):
    """parallelize_gpt with the vocabulary sharded too (vocab_plan); in place.

    Forward: the embedding's masked lookup and all-reduce; logits stay Shard(-1), never gathered;
    loss_parallel's cross-entropy all-reduces per-token max and sums. Backward: the head's input
    gradient is all-reduced. Train it inside ``loss_context(True)``.
    """
    return parallelize_module(gpt, tp_mesh, vocab_plan(gpt.config))


def loss_context(vocab_parallel):
    """What forward and backward of a plan's model must run inside: loss_parallel() for the
    vocab-sharded plan (cross-entropy on Shard(-1) logits), nothing for the replicated one."""
    import contextlib

    from torch.distributed.tensor.parallel import loss_parallel
    return loss_parallel() if vocab_parallel else contextlib.nullcontext()
