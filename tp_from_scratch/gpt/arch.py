"""The architectures: what each is made of, and how tensor parallelism splits it. Written once.

    ARCHS[arch]            the preset: norm, position, MLP, biases, head (GPTConfig fills its
                           fields left at None from here)
    PLANS[arch]            the sharding plan, in the shape of DTensor's ``parallelize_plan``:
                           {module name pattern: style}, "*" standing for any block index

Everything else that knows how a parameter is split is derived from the plan: the model's
layers (gpt.model builds a block's linear as the plan's style says), ``shard_axis`` and
``replicas_of`` (the state-dict conversions and checkpoints), the planner's parameter inventory
(gpt.inventory), partial sync's replicated parameters, and the DTensor plans (gpt.dtensor_plan,
and a later lesson's with sequence parallelism).

The styles, in the literature's words (JAX-scaling-book notation on the right):

    COLWISE         ColumnParallelLinear: W[out_t, in], bias b[out_t]      output Sharded
    KV_COLWISE      COLWISE over whole KV heads: with nkv < t each KV head is held by t/nkv
                    neighbouring ranks, its rows replicated there, their gradients summed
    ROWWISE         RowParallelLinear: W[out, in_t], bias whole            output Partial -> g
    VOCAB_PARALLEL  VocabParallelEmbedding / the LM head: E[V_t, H]        vocabulary rows Sharded
    REPLICATED      every rank holds all of it (norms, the position embedding)

A new architecture (say one with latent attention: its latent down-projections REPLICATED, its
up-projections COLWISE, mixture-of-experts split by expert) adds a preset and a plan, and new
styles where it needs them.
"""

# ---------------------------------------------------------------------------------------
# The presets
# ---------------------------------------------------------------------------------------

# arch -> the values its fields take when a GPTConfig leaves them at None
ARCHS = {
    "gpt": dict(norm="layernorm", norm_eps=1e-5, position="learned", mlp="gelu", gelu="erf",
                bias=True, key_bias=False, tie_embeddings=True),
    "gpt2": dict(norm="layernorm", norm_eps=1e-5, position="learned", mlp="gelu", gelu="tanh",
                 bias=True, key_bias=True, tie_embeddings=True),
    "llama": dict(norm="rmsnorm", norm_eps=1e-6, position="rope", mlp="swiglu", gelu="erf",
                  bias=False, key_bias=False, tie_embeddings=False),
}

# ---------------------------------------------------------------------------------------
# The sharding plans
# ---------------------------------------------------------------------------------------

COLWISE, KV_COLWISE, ROWWISE = "colwise", "kv_colwise", "rowwise"
VOCAB_PARALLEL, REPLICATED = "vocab_parallel", "replicated"

# style -> {parameter of the module: the axis TP splits (None: whole on every rank)}
SPLIT_AXES = {
    COLWISE: {"weight": 0, "bias": 0},      # (out, in): the output rows, and the bias alike
    KV_COLWISE: {"weight": 0, "bias": 0},
    ROWWISE: {"weight": 1, "bias": None},   # (out, in): the input columns; the bias is added after g
    VOCAB_PARALLEL: {"weight": 0},          # (V, H): the vocabulary rows
    REPLICATED: {},
}

_EMBEDDINGS = {"wte": VOCAB_PARALLEL, "wpe": REPLICATED}  # wpe: learned positions only
_ATTENTION = {"blocks.*.ln1": REPLICATED,
              "blocks.*.attn.q": COLWISE, "blocks.*.attn.k": KV_COLWISE, "blocks.*.attn.v": KV_COLWISE,
              "blocks.*.attn.o": ROWWISE,
              "blocks.*.ln2": REPLICATED}
_GELU_MLP = {"blocks.*.mlp.fc": COLWISE, "blocks.*.mlp.proj": ROWWISE}
_SWIGLU_MLP = {"blocks.*.mlp.gate": COLWISE, "blocks.*.mlp.up": COLWISE, "blocks.*.mlp.down": ROWWISE}
_HEAD = {"ln_f": REPLICATED, "lm_head": VOCAB_PARALLEL}

# every module a config of the architecture may have (a tied model has no lm_head, RoPE no wpe)
PLANS = {
    "gpt": {**_EMBEDDINGS, **_ATTENTION, **_GELU_MLP, **_HEAD},
    "llama": {**_EMBEDDINGS, **_ATTENTION, **_SWIGLU_MLP, **_HEAD},
}
PLANS["gpt2"] = PLANS["gpt"]  # the same modules; only the preset's details differ


def _matches(pattern, name):
    """'blocks.*.attn.q' matches 'blocks.3.attn.q', and a name that ends like it ('attn.q', a
    module named inside a block; 'model.blocks.3.attn.q'): '*' stands for any one component."""
    p, n = pattern.split("."), name.split(".")
    return all(a in ("*", b) for a, b in zip(reversed(p), reversed(n)))


def module_style(module, arch=None):
    """The plan's style of ``module`` (e.g. 'blocks.3.attn.k' -> KV_COLWISE), or None if the plan
    does not name it (a module outside the GPT, like the ViT's patch embedding: replicated).

    arch None: any architecture's plan (a module name means the same in every plan).
    """
    for plan in [PLANS[arch]] if arch else PLANS.values():
        for pattern, style in plan.items():
            if _matches(pattern, module):
                return style
    return None


def shard_axis(name, arch=None):
    """The axis of parameter ``name`` split across TP ranks, or None when it is replicated.

    From the plan: column-parallel weights (out, in) and their biases split the out axis (0);
    row-parallel weights split the in axis (1) and keep their bias whole (added once, after
    g); the token embedding and LM head split the vocabulary rows (0); norms, the position
    embedding and row biases are replicated.
    """
    module, _, leaf = name.rpartition(".")
    return SPLIT_AXES.get(module_style(module, arch), {}).get(leaf)


def kv_replicas(config, tp):
    """How many ranks hold each KV head: 1 when t divides nkv, else t / nkv (nkv < t)."""
    return max(1, tp // config.n_kv_heads)


def replicas_of(name, config, tp):
    """How many neighbouring ranks hold the same piece of ``name``: t/nkv for k, v when nkv < t."""
    module = name.rpartition(".")[0]
    return kv_replicas(config, tp) if module_style(module, config.arch) == KV_COLWISE else 1


def plan_modules(arch, style, n_layers):
    """The module names of ``arch``'s plan with ``style``, '*' expanded over n_layers blocks."""
    names = []
    for pattern, s in PLANS[arch].items():
        if s == style:
            names += [pattern.replace("*", str(i)) for i in range(n_layers)] if "*" in pattern else [pattern]
    return names
