"""DeepSeek-V3's sharding plans, one per MoE layout, in the GPT's vocabulary (gpt.arch). Written once.

    PLANS[layout]            {module name pattern: style}, "*" standing for any layer index
    model_plan(layout)       the same with each MoE layer one entry (MOE): what model.parallelize applies
    SPLITS[style]            {parameter of the module: how TP splits it}
    split_of(name, layout)   the split of one parameter (an axis, a Stacked, or None: whole)
    split_axis(name, layout) the axis it is split on (None: whole)
    shard / unshard          one tensor's piece on rank r, and the whole from every rank's piece

Everything that cuts or glues a DeepSeek-V3 tensor reads these tables: the TP model itself
(model.parallelize applies the plan to the single-device DeepseekV3, through gpt.parallelize's
walker), the MoE layers' ``from_module``, the checkpoints (checkpoint.DeepSeekSharding), the
checks, and Lesson 12's first figure.

Per decoder layer, with t ranks (names are transformers', as the model's):

    module                                  tp / etp (tokens replicated)   ep (each rank its own tokens)
    input_layernorm, post_attention_layernorm   REPLICATED                 REPLICATED
    self_attn.q_a_proj, kv_a_proj_with_mqa,     REPLICATED: every rank     REPLICATED
      and their norms (the latents)             computes the same latents
    self_attn.q_b_proj, kv_b_proj, (q_proj)     COLWISE: by heads          REPLICATED
    self_attn.o_proj                            ROWWISE                    REPLICATED
    mlp.copy_in; gate_proj, up_proj / down_proj COPY_IN; COLWISE / ROWWISE REPLICATED
      (the dense layers' FFN)
    mlp.gate (the router)                       REPLICATED                 REPLICATED
    mlp.shared_experts.gate_proj, up_proj /     COLWISE / ROWWISE          REPLICATED
      down_proj
    mlp.experts                                 tp: EXPERTS, etp: EXPERT_TP   EXPERTS

and the embedding, final norm and LM head REPLICATED in every layout (the lesson is about
attention and experts). Under expert parallelism REPLICATED modules see only this rank's
tokens: their gradients are summed over the ranks (data parallelism), which is the model's
business (model.sum_replicated_gradients), not the split's. The two expert styles:

    EXPERTS     E/t whole experts per rank: gate_up_proj (E, 2F, H) and down_proj (E, H, F)
                split on the expert axis
    EXPERT_TP   every expert split like a Megatron MLP: the F columns of gate and of up (stacked
                in gate_up_proj, gate rows over up rows: each half split alike), rows of down
"""
from typing import NamedTuple

import torch

from tp_from_scratch.gpt.arch import COLWISE, COPY_IN, REPLICATED, ROWWISE, SPLIT_AXES, module_style
from tp_from_scratch.gpt.parallelize import cut, glue
from tp_from_scratch.sharding import shard_sizes

EXPERTS, EXPERT_TP = "experts", "expert_tp"
MOE = "moe"   # a whole MoE layer, in model_plan only (its parts are cut by PLANS)


class Stacked(NamedTuple):
    """``parts`` tensors stacked along ``axis`` (gate over up), each split along that axis alike."""
    axis: int
    parts: int


# style -> {parameter of the module: its split (an axis, a Stacked, or None: whole)}
SPLITS = {**SPLIT_AXES,
          EXPERTS: {"gate_up_proj": 0, "down_proj": 0},                  # (E, 2F, H), (E, H, F): experts
          EXPERT_TP: {"gate_up_proj": Stacked(1, 2), "down_proj": 2}}    # F columns of each expert

_ENDS = {"embed_tokens": REPLICATED, "norm": REPLICATED, "lm_head": REPLICATED}
# self_attn.copy_in: the one f on the latents, in front of q_b / kv_b (q_proj), which skip their own
_ATTENTION = {"layers.*.input_layernorm": REPLICATED, "layers.*.self_attn.copy_in": COPY_IN,
              "layers.*.self_attn.q_a_proj": REPLICATED, "layers.*.self_attn.q_a_layernorm": REPLICATED,
              "layers.*.self_attn.q_b_proj": COLWISE,
              "layers.*.self_attn.q_proj": COLWISE,      # q_lora_rank None: no query latent
              "layers.*.self_attn.kv_a_proj_with_mqa": REPLICATED, "layers.*.self_attn.kv_a_layernorm": REPLICATED,
              "layers.*.self_attn.kv_b_proj": COLWISE,
              "layers.*.self_attn.o_proj": ROWWISE,
              "layers.*.post_attention_layernorm": REPLICATED}
_DENSE_FFN = {"layers.*.mlp.copy_in": COPY_IN, "layers.*.mlp.gate_proj": COLWISE, "layers.*.mlp.up_proj": COLWISE, "layers.*.mlp.down_proj": ROWWISE}
_MOE = {"layers.*.mlp.gate": REPLICATED,
        "layers.*.mlp.shared_experts.gate_proj": COLWISE, "layers.*.mlp.shared_experts.up_proj": COLWISE,
        "layers.*.mlp.shared_experts.down_proj": ROWWISE}
_SPLIT_BY_HEADS = {**_ENDS, **_ATTENTION, **_DENSE_FFN, **_MOE}
MOE_LAYER, _MOE_PARTS = "layers.*.mlp", {*_MOE, "layers.*.mlp.experts"}

# layout (model.MODEL_LAYOUTS) -> the plan
PLANS = {
    "experts on all tokens": {**_SPLIT_BY_HEADS, "layers.*.mlp.experts": EXPERTS},
    "expert tensor parallel": {**_SPLIT_BY_HEADS, "layers.*.mlp.experts": EXPERT_TP},
    # every rank its own tokens: all but the routed experts whole on every rank
    "expert parallel": {**{pattern: REPLICATED for pattern in _SPLIT_BY_HEADS}, "layers.*.mlp.experts": EXPERTS},
}


def model_plan(layout):
    """The plan model.parallelize applies to the single-device model: PLANS[layout] with the MoE
    layer's parts (router, shared experts, routed experts) folded into one entry for the whole
    layer, MOE_LAYER: MOE. The layout's MoE layer is built whole from the single-device one
    (expert_parallel's ``from_module``, which cuts each part by PLANS[layout]), so the walker,
    which visits children before parents, must leave those parts untouched. MOE_LAYER also
    names a dense layer's FFN (layers.i.mlp): the MOE style leaves that one as it is."""
    if layout not in PLANS:
        raise ValueError(f"layout {layout!r} is not one of {tuple(PLANS)}")
    return {**{p: s for p, s in PLANS[layout].items() if p not in _MOE_PARTS}, MOE_LAYER: MOE}


def split_of(name, layout):
    """The split of parameter (or buffer) ``name`` under ``layout``'s plan: an axis, a Stacked, or
    None (whole on every rank). Names are the model's ("layers.3.self_attn.o_proj.weight") or a
    MoE layer's own ("experts.down_proj"): a pattern matches the end of a name."""
    if layout not in PLANS:
        raise ValueError(f"layout {layout!r} is not one of {tuple(PLANS)}")
    module, _, leaf = name.rpartition(".")
    style = module_style(module, plan=PLANS[layout])
    if style is None:
        raise ValueError(f"{name}: no entry in deepseek.arch.PLANS[{layout!r}] for {module or name}")
    return SPLITS[style].get(leaf)


def split_axis(name, layout):
    """The axis parameter ``name`` is split on under ``layout`` (a Stacked's too), None when whole."""
    split = split_of(name, layout)
    return split.axis if isinstance(split, Stacked) else split


def _cut(full, axis, t, r):
    """Rank r's piece of ``full`` along ``axis``, split like numpy.array_split (whole when None)."""
    return cut(full, axis, None if axis is None else shard_sizes(full.shape[axis], t), r)


def shard(name, full, layout, t, r):
    """Rank r's piece (a copy) of the full tensor ``name`` under ``layout``, from the plan."""
    split = split_of(name, layout)
    if isinstance(split, Stacked):
        return torch.cat([_cut(part, split.axis, t, r) for part in full.chunk(split.parts, dim=split.axis)],
                         dim=split.axis)
    return _cut(full, split, t, r)


def unshard(name, pieces, layout):
    """The full tensor ``name`` from every rank's piece under ``layout`` (a list in rank order):
    the inverse of shard (a checkpoint saved at t ranks in one layout is glued back with it,
    then cut for another t or layout)."""
    split = split_of(name, layout)
    if isinstance(split, Stacked):
        parts = [p.chunk(split.parts, dim=split.axis) for p in pieces]   # each piece: its gate, its up
        return torch.cat([glue([p[i] for p in parts], split.axis) for i in range(split.parts)], dim=split.axis)
    return glue(pieces, split)


def clip_placement(layout, group="tp"):
    """name -> the groups parameter ``name`` is split over, for gpt/clip.py's norm under ``layout``:
    {group: 1} when the plan splits it (each rank a distinct piece: its experts, its heads' rows),
    {} when it is whole on every rank. Under expert parallelism the whole ones' gradients are
    the same on every rank once model.sum_replicated_gradients has summed them, so counting them
    on one rank is right; in the token-replicated layouts they are the same already (f and g)."""
    return lambda name: {} if split_of(name, layout) is None else {group: 1}
