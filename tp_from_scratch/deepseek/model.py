"""DeepSeek-V3 on one device, and on t ranks by its plan, two ways:

    DeepseekV3(config)                  the single-device model (MLA with all its heads, the dense
                                        FFNs, DeepSeekMoE, nn.Embedding, the LM head): no group,
                                        no parallel layer; the reference
    parallelize(model, group, layout)   this rank's model, in place: deepseek.arch's plan for the
                                        layout applied by gpt.parallelize's walker (Lesson 6's)
    ParallelDeepseekV3(config, group=, layout=)   the same, built: parallelize(DeepseekV3(config), ...)

* tensor parallel: every rank holds every token; MLA heads split (Lesson 4's column/row
  pattern, one f on the latents at MLA's copy_in point), the dense FFNs of the first
  ``first_k_dense_replace`` layers split likewise, DeepSeekMoE in an all-reduce layout
  ("experts on all tokens" or "expert tensor parallel"); DeepSeek-V3's own servers pair TP4
  attention with expert-parallel experts (report §3.4);
* "expert parallel" (DeepSeek-V3's training): every rank its own tokens; attention, dense
  FFNs, embedding and head whole on every rank (data parallel: their gradients summed over
  the ranks after backward, ``sum_replicated_gradients``), only the routed experts spread.

The styles (DEEPSEEK_STYLES) are Lesson 6's TP_STYLES and one more, MOE: each MoE layer is
replaced whole by its layout's layer (expert_parallel.LAYOUTS[layout].from_module, which cuts
router, shared and routed experts by the same plan from the untouched single-device layer;
arch.model_plan keeps the walker off those parts, which it would otherwise visit first).

Equal to transformers' DeepseekV3ForCausalLM with the same weights (tests/test_deepseek_model.py),
and the parallel model to the single-device one (tests/test_deepseek_parallelize.py).
Embedding, final norm and LM head are replicated: the lesson is about attention and experts.

    from_hf_state_dict(config, sd, group=...)   rank r's model from a full transformers state dict:
                                                the single-device model loaded, then parallelized
    to_hf_state_dict(model)                     the full state dict back (t = 1)
    load_hf(path, group=...) / save_hf(directory, model)   the same from / to a save_pretrained
                                                directory (files read and written by gpt.convert)
    generate(model, prompt, n)                  greedy, with the latent cache
"""
from functools import partial
from types import SimpleNamespace

import torch

from tp_from_scratch.gpt.parallelize import TP_STYLES
from tp_from_scratch.gpt.parallelize import parallelize as gpt_parallelize
from tp_from_scratch.nn.mappings import all_reduce, tp_world_size
from tp_from_scratch.sharding import check_divisible

from .arch import MOE, PLANS, model_plan
from .config import MoEConfig
from .expert_parallel import LAYOUTS, check_fits
from .mla import LatentCache
from .moe import DeepSeekMoE, GatedFFN
from .single_device import DeepseekV3, pad_token_id, tied

INFERENCE_LAYOUTS = ("experts on all tokens", "expert tensor parallel")  # tokens replicated
MODEL_LAYOUTS = INFERENCE_LAYOUTS + ("expert parallel",)
assert set(MODEL_LAYOUTS) == set(PLANS), "every layout has its sharding plan (arch.PLANS)"


def check_config(config, t, layout="experts on all tokens"):
    """Refuse, by name, what the course cannot map on t ranks in ``layout``, before any weight is
    built. Returns the MoE layers' MoEConfig (MoEConfig.from_hf, as DeepseekV3 reads it)."""
    moe = MoEConfig.from_hf(config)  # routing method, scoring, activation
    rope = config.rope_parameters
    rope_type = rope.get("rope_type", "default")
    if rope_type not in ("default", "yarn"):
        raise ValueError(f"rope_type={rope_type!r} is not supported: the course implements plain RoPE and "
                         "YaRN (DeepSeek-V3's)")
    for key, what in (("original_max_position_embeddings", "the pre-training context it stretches"),
                      ("factor", "how many times it stretches it")):
        if rope_type == "yarn" and not rope.get(key):
            raise ValueError(f"rope_type='yarn' needs {key} ({what}) in rope_parameters")
    if config.attention_bias:
        raise ValueError("attention_bias=True is not supported: DeepSeek-V3 has no attention biases")
    pad = pad_token_id(config)
    if pad is not None and not (type(pad) is int and 0 <= pad < config.vocab_size):
        raise ValueError(f"pad_token_id {pad!r} is not a token id in [0, vocab_size={config.vocab_size})")
    whole = 1 if layout == "expert parallel" else t   # attention and dense FFNs: whole under EP
    check_divisible(config.num_attention_heads, whole, "num_attention_heads")
    check_divisible(config.intermediate_size, whole, "intermediate_size (dense layers)")
    if layout not in MODEL_LAYOUTS:
        raise ValueError(f"layout {layout!r} is not one of {MODEL_LAYOUTS}")
    check_fits(layout, moe, t)
    return moe


class _LayoutConfig:
    """The config as gpt.parallelize and the styles read it: validate(t) is check_config in the
    layout, ``layout`` says which MoE layer the MOE style builds; any other field is the config's."""

    def __init__(self, config, layout):
        self.config, self.layout = config, layout

    def validate(self, t):
        check_config(self.config, t, self.layout)

    def __getattr__(self, name):   # only for names not set in __init__
        if name == "config":
            raise AttributeError(name)
        return getattr(self.config, name)


def moe_style(module, group, site):
    """MOE: a single-device DeepSeekMoE -> this rank's layer of the layout (its from_module cuts
    each part as PLANS[layout] says); a dense layer's FFN, also named layers.i.mlp, stays (its
    copy_in, gate, up and down are planned themselves)."""
    if isinstance(module, DeepSeekMoE):
        return LAYOUTS[site.config.layout].from_module(module, group=group)
    if isinstance(module, GatedFFN):
        return module
    raise TypeError(f"{site.name}: MOE replaces a DeepSeekMoE (or leaves a dense GatedFFN), not a "
                    f"{type(module).__name__}")


# style -> make(module, group, site): Lesson 6's table and the whole MoE layer
DEEPSEEK_STYLES = {**TP_STYLES, MOE: moe_style}


def parallelize(model, group, layout="experts on all tokens"):
    """Turn the single-device DeepseekV3 ``model`` into this rank's model over ``group`` in
    ``layout``, in place: arch.model_plan(layout) applied by gpt.parallelize with DEEPSEEK_STYLES.
    Every rank calls it with the same full weights; no communication. Returns ``model``."""
    gpt_parallelize(model, group, model_plan(layout), DEEPSEEK_STYLES, _LayoutConfig(model.config, layout))
    model.layout = layout
    model.reduce_replicated = partial(all_reduce, group)  # sum_replicated_gradients' sum (expert parallel)
    return model


class ParallelDeepseekV3(DeepseekV3):
    """parallelize(DeepseekV3(config), group, layout), built in one call (the name the
    trainer, the checks and the lesson use). Each rank briefly holds the whole model."""

    def __init__(self, config, *, group, layout="experts on all tokens"):
        check_config(config, tp_world_size(group), layout)  # refused by name before any weight is built
        super().__init__(config)
        parallelize(self, group, layout)


# ---- transformers' names and layouts ------------------------------------------------------

def hf_name(name):
    """Our parameter name -> transformers' (everything but the LM head lives under 'model.')."""
    return name if name.startswith("lm_head.") else f"model.{name}"


def _mtp_layer(name, config):
    """Is ``name`` a tensor of the multi-token-prediction module DeepSeek-V3's files append as
    layers num_hidden_layers .. + num_nextn_predict_layers - 1 (transformers skips them too)?"""
    parts = name.split(".")
    extra = getattr(config, "num_nextn_predict_layers", 0) or 0
    return (len(parts) > 2 and parts[:2] == ["model", "layers"] and parts[2].isdigit()
            and config.num_hidden_layers <= int(parts[2]) < config.num_hidden_layers + extra)


def from_hf_state_dict(config, sd, *, group, layout="experts on all tokens", dtype=torch.float64):
    """Rank r's model holding its part of transformers' full state dict ``sd``: the single-device
    DeepseekV3 loaded with ``sd``, then parallelized (each tensor cut as the layout's plan says).
    Each rank holds the whole model until parallelize has cut it, as gpt.parallelize.gpt_to_tp.

    Every tensor the model needs must be there, and every tensor there must have its place, as
    gpt.convert demands of a GPT's files; the multi-token-prediction layers (``_mtp_layer``) are
    skipped with a warning, and quantized weights (float8 with their scales) are refused."""
    check_config(config, tp_world_size(group), layout)  # before any weight is built
    model = DeepseekV3(config).to(dtype)
    if tied(config) and "lm_head.weight" not in sd:   # a tied model's files hold the embedding only
        sd = {**sd, "lm_head.weight": sd.get(hf_name("embed_tokens.weight"))}
    wanted = {hf_name(n) for n in model.state_dict()}
    missing = sorted(wanted - set(sd))
    if missing:
        raise ValueError(f"the state dict lacks {len(missing)} tensors the config needs, e.g. {missing[0]}")
    mtp = [k for k in sd if k not in wanted and _mtp_layer(k, config)]
    unused = sorted(k for k in sd if k not in wanted and k not in mtp)
    if unused:
        raise ValueError(f"{len(unused)} tensors have no place in the model, e.g. {unused[:3]}"
                         + (" (block-quantized float8 weights: dequantize them first)"
                            if any(k.endswith("_scale_inv") for k in unused) else ""))
    floats8 = [k for k in wanted if "float8" in str(sd[k].dtype)]
    if floats8:
        raise ValueError(f"{floats8[0]} is {sd[floats8[0]].dtype}: quantized weights are not supported "
                         "(dequantize them to bfloat16 or float32 first)")
    if mtp:
        import warnings
        warnings.warn(f"skipped {len(mtp)} tensors of the multi-token-prediction module (layers "
                      f"{config.num_hidden_layers} and up): the course's model predicts the next token only")
    model.load_state_dict({n: sd[hf_name(n)] for n in model.state_dict()})  # copies, cast to dtype
    return parallelize(model, group, layout)


def to_hf_state_dict(model):
    """transformers' full state dict of a single-device or one-rank model (every tensor whole)."""
    if model.group is not None and tp_world_size(model.group) != 1:
        raise ValueError("to_hf_state_dict needs the whole model: build it at t=1 (from_hf_state_dict "
                         "with a one-rank group) before exporting")
    return {hf_name(n): v.detach().clone() for n, v in model.state_dict().items()}


@torch.no_grad()
def generate(model, prompt, new_tokens):
    """Greedy decoding with the latent cache: (B, T0) -> (B, T0 + new_tokens). Returns
    (ids, cache): the prompt runs once, then one token per step reads the cached latents."""
    cache = LatentCache()
    ids, logits = prompt, model(prompt, cache)
    for _ in range(new_tokens):
        nxt = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        ids = torch.cat([ids, nxt], dim=1)
        logits = model(nxt, cache)
    return ids, cache


# ---- files: a save_pretrained directory (config.json + safetensors) ----------------------

FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "first_k_dense_replace",
          "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
          "v_head_dim", "rms_norm_eps", "hidden_act", "moe_intermediate_size", "n_routed_experts",
          "num_experts_per_tok", "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor",
          "n_shared_experts")


class DeepseekConfig(SimpleNamespace):
    """transformers' DeepseekV3Config fields as attributes (``config.hidden_size``)."""

    def to_dict(self):
        """What config.json holds (and a checkpoint records and compares): the model's fields."""
        return dict(vars(self))


def config_from_hf(hf):
    """The model's config (transformers' attribute names) from a config.json dict, or a
    ValueError naming the model type or the first missing field."""
    if hf.get("model_type") != "deepseek_v3":
        raise ValueError(f"model_type {hf.get('model_type')!r}: only 'deepseek_v3' checkpoints are supported here")
    missing = [k for k in FIELDS if k not in hf]
    if missing:
        raise ValueError(f"config.json lacks {missing[0]} (and {len(missing) - 1} more DeepseekV3 fields)")
    hf = dict(hf)
    if "rope_parameters" not in hf:  # config.json files written before transformers 5 (DeepSeek-V3's own)
        scaling = {k: v for k, v in (hf.get("rope_scaling") or {}).items() if k != "type"}
        hf["rope_parameters"] = {**scaling, "rope_theta": hf.get("rope_theta", 10000.0),
                                 "rope_type": scaling.get("rope_type", (hf.get("rope_scaling") or {}).get("type", "default"))}
    hf.setdefault("rope_interleave", True)
    hf.setdefault("attention_bias", False)
    hf.setdefault("tie_word_embeddings", False)   # DeepseekV3Config's defaults
    hf.setdefault("pad_token_id", None)
    return DeepseekConfig(**hf)


def _experts_prefixes(config):
    return [f"model.layers.{i}.mlp.experts" for i in range(config.first_k_dense_replace, config.num_hidden_layers)]


def stack_experts(sd, config):
    """Files hold each expert apart (experts.e.{gate,up,down}_proj.weight, as DeepSeek-V3's own
    checkpoint); transformers' modules (and ours) stack them: gate_up_proj (E, 2F, H) with gate
    rows over up rows, down_proj (E, H, F). A new dict; ``sd`` is not modified."""
    sd = dict(sd)
    for prefix in _experts_prefixes(config):
        if f"{prefix}.gate_up_proj" in sd:
            continue
        E = range(config.n_routed_experts)
        gate_up = [torch.cat([sd.pop(f"{prefix}.{e}.gate_proj.weight"), sd.pop(f"{prefix}.{e}.up_proj.weight")])
                   for e in E]
        sd[f"{prefix}.gate_up_proj"] = torch.stack(gate_up)
        sd[f"{prefix}.down_proj"] = torch.stack([sd.pop(f"{prefix}.{e}.down_proj.weight") for e in E])
    return sd


def unstack_experts(sd, config, prefixes=None):
    """The inverse of stack_experts: one gate, up and down weight per expert, for the files
    (only the MoE layers named in ``prefixes``, where given)."""
    sd = dict(sd)
    for prefix in _experts_prefixes(config) if prefixes is None else prefixes:
        gate_up, down = sd.pop(f"{prefix}.gate_up_proj"), sd.pop(f"{prefix}.down_proj")
        for e in range(config.n_routed_experts):
            sd[f"{prefix}.{e}.gate_proj.weight"], sd[f"{prefix}.{e}.up_proj.weight"] = gate_up[e].chunk(2)
            sd[f"{prefix}.{e}.down_proj.weight"] = down[e]
    return sd


def hf_shapes(config, sd):
    """{file name: shape} of every tensor a save_pretrained file of ``config`` holds, read off a
    one-rank model built on the meta device (shapes, no memory). Each MoE layer's experts one by
    one, or stacked where ``sd`` holds them stacked; a tied head only where ``sd`` holds a copy."""
    with torch.device("meta"):
        full = to_hf_state_dict(DeepseekV3(config))
    apart = [p for p in _experts_prefixes(config) if f"{p}.gate_up_proj" not in sd]
    shapes = {k: tuple(v.shape) for k, v in unstack_experts(full, config, apart).items()}
    if tied(config) and "lm_head.weight" not in sd:
        del shapes["lm_head.weight"]
    return shapes


def load_hf(path, *, group, layout="experts on all tokens", dtype=torch.float64):
    """Rank r's model from a save_pretrained directory or .safetensors file (gpt.convert.read_hf).
    Every tensor's name and shape is checked against the config before any is stacked or cut."""
    from tp_from_scratch.gpt.convert import check_tensors, head_tied_as_transformers, read_hf, require_head
    hf, sd, where = read_hf(path)
    config = config_from_hf(hf)
    check_config(config, tp_world_size(group), layout)  # before any tensor is touched
    require_head(sd, tied(config), where)
    check_tensors(sd, hf_shapes(config, sd), where)
    config.tie_word_embeddings = head_tied_as_transformers(sd, tied(config), hf_name("embed_tokens.weight"), where)
    if tied(config):
        sd.pop("lm_head.weight", None)                   # the embedding's copy
    return from_hf_state_dict(config, stack_experts(sd, config), group=group, layout=layout, dtype=dtype)


def save_hf(directory, model):
    """A directory transformers' DeepseekV3ForCausalLM.from_pretrained reads: config.json and
    model.safetensors, from a one-rank model (a tied head left out: transformers ties it back)."""
    from tp_from_scratch.gpt.convert import write_hf_files
    sd = unstack_experts(to_hf_state_dict(model), model.config)
    if tied(model.config):
        sd.pop("lm_head.weight")
    write_hf_files(directory, sd, {**model.config.to_dict(), "model_type": "deepseek_v3"})
