"""How this course's TP models lay out each module's input and output, from their sharding plans.

The plan (gpt.arch.PLANS) says each module's style; the style says the layout of what the
module reads and writes on each rank:

    style            input        output
    COLWISE          Replicated   Sharded(-1)          (..., out/t): its rows of W
    KV_COLWISE       Replicated   Sharded(-1), whole KV heads; with nkv < t each held by t/nkv ranks
    ROWWISE          Sharded(-1)  Replicated           (after g)
    VOCAB_PARALLEL   Replicated   Replicated           the embedding, after its g; the loss
                                                       (cross_entropy) reads Sharded(-1) logits
    REPLICATED       Replicated   Replicated

LEAD: this table is verify's own until gpt/arch.py records each style's layouts as data
(OUTPUT_LAYOUT, from the plan refactor); then import that instead and delete STYLE_LAYOUTS.
"""
from tp_from_scratch.gpt.arch import COLWISE, KV_COLWISE, REPLICATED as REPLICATED_STYLE, ROWWISE, VOCAB_PARALLEL

from tp_from_scratch.gpt.arch import kv_replicas, module_style, shard_axis, split_sizes
from tp_from_scratch.gpt.parallelize import shard_tensor
from tp_from_scratch.verify.locator import REPLICATED, sharded

# style -> (input layout, output layout); replicas of a KV_COLWISE output are the config's
STYLE_LAYOUTS = {
    COLWISE: (REPLICATED, sharded(-1)),
    KV_COLWISE: (REPLICATED, sharded(-1)),
    ROWWISE: (sharded(-1), REPLICATED),
    VOCAB_PARALLEL: (REPLICATED, REPLICATED),
    REPLICATED_STYLE: (REPLICATED, REPLICATED),
}


def gpt_layout(config, t, rank):
    """layout_of(kind, name, local, reference) for the TP GPT of ``config`` on t ranks:
    the plan's layout, or a message when the local shape is not the one the plan gives."""
    replicas = kv_replicas(config, t)

    def layout_of(kind, name, local, reference):
        if name == "(logits)":
            return sharded(-1)      # (B, T, V/t): the vocabulary rows of the LM head
        style = module_style(name, config.arch)
        if style is None:
            return REPLICATED       # blocks, attention, MLP, the model: Replicated in and out
        if style == VOCAB_PARALLEL and name.rpartition(".")[2] == "cross_entropy" and kind == "input":
            return sharded(-1)      # the loss module reads the head's logits (B*T, V/t)
        layout = STYLE_LAYOUTS[style][0 if kind == "input" else 1]
        if style == KV_COLWISE and kind != "input":
            layout = sharded(-1, replicas)
        if layout.sharded:
            width = reference.shape[-1]
            want = split_sizes(name, config, t, width)[rank // layout.replicas]
            if local.shape[-1] != want:
                whole = f"each of its {width // config.head_size} heads whole" if style != COLWISE else ""
                held = (f", every KV head held whole by {replicas} ranks" if style == KV_COLWISE and replicas > 1
                        else "")
                return (f"rank {rank} holds {local.shape[-1]} of its {width} {kind} features where the plan's "
                        f"{style} style gives it {want} ({whole}{held}): heads split where they should be "
                        "whole or replicated")
        return layout
    return layout_of


def deepseek_layout(config):
    """layout_of for a ParallelDeepseekV3 in a tokens-replicated layout: the MLA projections by
    their split (q_b, kv_b column; o partial, summed by the attention's g after it); inside the
    MoE layers the records are skipped (their layouts are the expert layout's own)."""
    from tp_from_scratch.verify.locator import Layout

    def layout_of(kind, name, local, reference):
        if name == "(logits)":
            return REPLICATED
        if ".mlp." in name:
            return None
        if name.endswith(("q_b_proj", "q_proj", "kv_b_proj")):
            return REPLICATED if kind == "input" else sharded(-1)
        if name.endswith("o_proj"):
            return sharded(-1) if kind == "input" else Layout(partial=True)
        return REPLICATED
    return layout_of


def gpt_misplaced(config, t, rank, reference, parallel):
    """The first parameter of ``parallel`` whose local shape is not the piece the plan gives this
    rank, as 'module: ...', or ''."""
    full = dict(reference.named_parameters())
    for name, p in parallel.named_parameters():
        if name not in full:
            continue
        axis, want = shard_axis(name, config.arch), tuple(full[name].shape)
        if axis is not None:
            want = tuple(shard_tensor(name, full[name], t, rank, config).shape)
        if tuple(p.shape) != want:
            module = name.rpartition(".")[0]
            return (f"{module} (parameter {name}): rank {rank} holds {tuple(p.shape)} where the plan's "
                    f"{module_style(module, config.arch)} style gives it {want}: the layer is built as "
                    "another style than the plan's")
    return ""
