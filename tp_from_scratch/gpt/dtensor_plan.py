"""The same GPT with PyTorch's own tensor parallelism (DTensor), for a side-by-side comparison.

The DTensor plan is derived from the architecture's sharding plan (gpt.arch.PLANS), style by style:

    ours (gpt.arch)     DTensor                                   gpt / gpt2           llama
    COLWISE             ColwiseParallel()   W[out_t, in]          attn.q, mlp.fc       attn.q, mlp.gate, mlp.up
    KV_COLWISE          ColwiseParallel()   (whole KV heads only)  attn.k, attn.v       attn.k, attn.v
    ROWWISE             RowwiseParallel()   W[out, in_t]          attn.o, mlp.proj     attn.o, mlp.down
    REPLICATED          (left alone)                              norms, wpe           norms

The attention code reads its head count off the tensor shapes, so after the q, k, v
weights become column shards it works on the local heads unchanged (RoPE turns each local head
by itself; SwiGLU multiplies gate and up shards element-wise). The embeddings, the norms and
the LM head stay replicated here (PyTorch can shard them too, with loss_parallel: vocab_plan;
tp_from_scratch's own model shards the vocabulary, which is the one difference in what the
two versions compute). A KV head held by several ranks (nkv < t, ours replicates it) has no
DTensor style: check_plannable refuses it rather than cut a head in two.
"""
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from tp_from_scratch.gpt.arch import COLWISE, KV_COLWISE, ROWWISE, VOCAB_PARALLEL, plan_modules


def check_plannable(config, tp):
    """Raise a ValueError unless DTensor's styles shard ``config`` over ``tp`` ranks as ours do."""
    config.validate(tp)
    config.check_even(tp, "DTensor's ColwiseParallel and RowwiseParallel (torch.chunk's split would cut a head)")
    if config.n_kv_heads % tp:
        raise ValueError(f"--impl dtensor needs the KV heads (n_kv_heads, --kv-heads) divisible by tp (got "
                         f"{config.n_kv_heads} and {tp}): ColwiseParallel would cut a key/value head across "
                         f"ranks, where --impl scratch replicates each KV head on the ranks that share it")


def tp_plan(config):
    """{module path: ColwiseParallel() or RowwiseParallel()} for every linear of every block,
    from the architecture's sharding plan (gpt.arch.PLANS)."""
    styles = {COLWISE: ColwiseParallel, KV_COLWISE: ColwiseParallel, ROWWISE: RowwiseParallel}
    return {name: make() for ours, make in styles.items()
            for name in plan_modules(config.arch, ours, config.n_layers)}


def parallelize_gpt(gpt, tp_mesh):
    """Shard a single-device GPT (every rank holding the same weights) over a 1-D DeviceMesh, in place.

    Forward per block: ColwiseParallel leaves each rank its heads / ffn columns; RowwiseParallel
    all-reduces the partial sums. Backward: the replicated input's gradient is all-reduced.
    """
    check_plannable(gpt.config, tp_mesh.size())
    return parallelize_module(gpt, tp_mesh, tp_plan(gpt.config))


# ---------------------------------------------------------------------------------------
# The same vocabulary sharding as ours (bench train's fair race): embedding and LM head split by V
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

    plan = tp_plan(config)
    # forward never calls lm_head: its style only shards its weight
    vocab = {"wte": RowwiseParallel(input_layouts=Replicate()),
             "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    for name in plan_modules(config.arch, VOCAB_PARALLEL, config.n_layers):  # wte, lm_head, cross_entropy
        if name in vocab and (name != "lm_head" or not config.tie_embeddings):  # a tied head is wte's weight
            plan[name] = vocab[name]  # the cross-entropy: loss_parallel() (loss_context), not a style
    # backward: the Replicate DTensor's gradient arrives Partial and is all-reduced (our f)
    plan["ln_f"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Replicate(),
                                       use_local_output=False)
    return plan


def parallelize_gpt_vocab(gpt, tp_mesh):
    """parallelize_gpt with the vocabulary sharded too (vocab_plan); in place.

    Forward: the embedding's masked lookup and all-reduce; logits stay Shard(-1), never gathered;
    loss_parallel's cross-entropy all-reduces per-token max and sums. Backward: the head's input
    gradient is all-reduced. Train it inside ``loss_context(True)``.
    """
    check_plannable(gpt.config, tp_mesh.size())
    return parallelize_module(gpt, tp_mesh, vocab_plan(gpt.config))


def loss_context(vocab_parallel):
    """What forward and backward of a plan's model must run inside: loss_parallel() for the
    vocab-sharded plan (cross-entropy on Shard(-1) logits), nothing for the replicated one."""
    import contextlib

    from torch.distributed.tensor.parallel import loss_parallel
    return loss_parallel() if vocab_parallel else contextlib.nullcontext()
