"""Test-only: seven TP bugs planted in this course's GPT / Llama, for the locator of `verify model`.

Each bug is made the way an engineer would make it, without touching the library: by a plan
changed for one module while the model is built (monkeypatching gpt.parallelize's view of the plan),
or by a module of the built TP model replaced. ``PLANTED[name] = (arch, t, plant, module, says)``:
plant(monkeypatch) returns a function that alters a built Pair (or None), ``module`` is what the
'first divergence:' line must name and ``says`` what it must say the divergence looks like.
"""
import torch

from tp_from_scratch.gpt import model as gpt_model
from tp_from_scratch.gpt import parallelize as gpt_parallelize
from tp_from_scratch.gpt.arch import COLWISE
from tp_from_scratch.nn import copy_to_tp_region, reduce_from_tp_region
from tp_from_scratch.nn.mappings import tp_rank
from tp_from_scratch.sharding import shard_sizes


def o_proj_colwise(monkeypatch):
    """attn.o planned colwise (its weight cut by output rows, its input read as whole)."""
    style, axis = gpt_parallelize.module_style, gpt_parallelize.shard_axis
    monkeypatch.setattr(gpt_parallelize, "module_style",
                        lambda name, arch=None, plan=None: COLWISE if name.endswith("attn.o") else style(name, arch, plan))
    monkeypatch.setattr(gpt_parallelize, "shard_axis",
                        lambda name, arch=None: 0 if ".attn.o." in name else axis(name, arch))


def kv_heads_split(monkeypatch):
    """With fewer KV heads than ranks, k and v cut into t pieces instead of whole heads replicated."""
    heads, sizes = gpt_parallelize.head_split_sizes, gpt_parallelize.split_sizes

    def kv(name):
        return name.removesuffix(".weight").removesuffix(".bias").endswith(("attn.k", "attn.v"))
    monkeypatch.setattr(gpt_parallelize, "kv_replicas", lambda config, tp: 1)
    monkeypatch.setattr(gpt_parallelize, "replicas_of", lambda name, config, tp: 1)
    monkeypatch.setattr(gpt_parallelize, "head_split_sizes",   # None: cut like numpy.array_split, t pieces
                        lambda name, config, tp: None if kv(name) else heads(name, config, tp))
    monkeypatch.setattr(gpt_parallelize, "split_sizes", lambda name, config, tp, size:
                        shard_sizes(size, tp) if kv(name) else sizes(name, config, tp, size))


def missing_f_in_layer_1(monkeypatch):
    """Block 1's attention without its f: its input gradient is never all-reduced."""
    def plant(pair):
        pair.parallel.blocks[1].attn.copy_in = lambda x: x
    return plant


def extra_all_reduce(monkeypatch):
    """Block 0's MLP output all-reduced a second time (t times the sum)."""
    def plant(pair):
        proj = pair.parallel.blocks[0].mlp.proj
        forward = proj.forward
        proj.forward = lambda x: reduce_from_tp_region(pair.group, forward(x))
    return plant


def rope_offset_on_rank_1(monkeypatch):
    """Rank 1 turns its queries by position + 1 and its keys by position (an off-by-one in one
    rank's query positions; a shift of both would cancel, RoPE's scores being relative)."""
    def rotate(x, positions, head_size, theta):          # (B, T, n*hs) -> the same, turned per head
        B, T, _ = x.shape
        cos, sin = gpt_model.rope_tables(positions, head_size, theta, x.dtype)
        heads = x.view(B, T, -1, head_size).transpose(1, 2)                  # (B, n, T, hs)
        return gpt_model.apply_rope(heads, cos, sin).transpose(1, 2).reshape(B, T, -1)

    def forward(attn, x, cache=None):
        x = attn.copy_in(x)
        positions = torch.arange(x.shape[1])
        q = rotate(attn.q(x), positions + 1, attn.head_size, attn.rope_theta)
        k = rotate(attn.k(x), positions, attn.head_size, attn.rope_theta)
        return attn.o(gpt_model.causal_self_attention(q, k, attn.v(x), attn.head_size, None, None, attn.causal))

    def plant(pair):
        if tp_rank(pair.group) == 1:
            for block in pair.parallel.blocks:
                block.attn.forward = lambda x, cache=None, attn=block.attn: forward(attn, x, cache)
    return plant


def cross_entropy_without_the_max(monkeypatch):
    """The vocab-parallel cross-entropy shifting each rank's logits by its OWN max (the max's
    all-reduce left out): the ranks' sums of exponentials are on different scales."""
    def local_max_cross_entropy(group, local_logits, target, ignore_index=-100, *, vocab_start=None):
        z = local_logits
        shifted = z - z.max(dim=-1, keepdim=True).values.detach()
        local_target = target - vocab_start
        outside = (local_target < 0) | (local_target >= z.shape[-1])
        picked = shifted.gather(-1, local_target.masked_fill(outside, 0).unsqueeze(-1)).squeeze(-1)
        target_logit = reduce_from_tp_region(group, picked.masked_fill(outside, 0.0))
        sum_exp = reduce_from_tp_region(group, shifted.exp().sum(-1))
        return (sum_exp.log() - target_logit).mean()
    monkeypatch.setattr(gpt_parallelize, "vocab_parallel_cross_entropy", local_max_cross_entropy)


def q_heads_in_the_wrong_order(monkeypatch):
    """Block 0's query heads dealt to the ranks in reverse (rank r holds the heads of rank t-1-r),
    its keys and values in order: each rank's queries meet another rank's keys."""
    def plant(pair):
        t, rank = pair.group.world_size, tp_rank(pair.group)
        full, q = pair.reference.blocks[0].attn.q, pair.parallel.blocks[0].attn.q
        with torch.no_grad():
            q.weight.copy_(full.weight.detach().chunk(t, dim=0)[t - 1 - rank])
            if q.bias is not None:
                q.bias.copy_(full.bias.detach().chunk(t)[t - 1 - rank])
    return plant


# name -> (arch, t, plant, the module the first divergence must name, what its line must say)
PLANTED = {
    "o_proj planned colwise": ("gpt", 2, o_proj_colwise, "blocks.0.attn.o", "built as another style than the plan"),
    "a missing f in one layer's backward": ("gpt", 2, missing_f_in_layer_1, "blocks.1.attn",
                                            "Partial where Replicate was expected"),
    "an extra all-reduce": ("gpt", 2, extra_all_reduce, "blocks.0.mlp.proj", "x t"),
    "KV heads split where they should be replicated": ("llama", 4, kv_heads_split, "blocks.0.attn.k",
                                                       "heads split"),
    "a RoPE position offset on one rank": ("llama", 2, rope_offset_on_rank_1, "blocks.0.attn", "wrong on rank 1 only"),
    "a vocab-parallel cross-entropy without the max": ("gpt", 2, cross_entropy_without_the_max, "cross_entropy",
                                                       "values differ"),
    "query heads dealt to the ranks in the wrong order": ("gpt", 2, q_heads_in_the_wrong_order, "blocks.0.attn.q",
                                                          "rows permuted"),
}

__all__ = ["PLANTED", "copy_to_tp_region", "torch"]
