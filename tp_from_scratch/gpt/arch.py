"""The architectures: what each is made of, and how tensor parallelism splits it. Written once.

    ARCHS[arch]            the preset: norm, position, MLP, biases, head (GPTConfig fills its
                           fields left at None from here)
    PLANS[arch]            the sharding plan, in the shape of DTensor's ``parallelize_plan``:
                           {module name pattern: style}, "*" standing for any block index
    OUTPUT_LAYOUT[style]   where a module of that style leaves its output under TP

Everything else that knows how a parameter is split is derived from the plan: the TP model
itself (gpt.parallelize applies the plan to the single-device GPT of gpt.model), ``shard_axis``
and ``replicas_of`` (the state-dict conversions and checkpoints), the planner's parameter
inventory (gpt.inventory), partial sync's replicated parameters, and the DTensor plans
(gpt.dtensor_plan, and a later lesson's with sequence parallelism).

The styles, in the literature's words (JAX-scaling-book notation on the right), and the layout
of the output each leaves (OUTPUT_LAYOUT):

    COPY_IN         Megatron's f: an input point (``copy_in``) where several column layers
                    start reading one Replicated x; identity forward, all-reduce backward  Replicated
    COLWISE         ColumnParallelLinear: W[out_t, in], bias b[out_t]      output Sharded(-1)
    KV_COLWISE      COLWISE over whole KV heads: with nkv < t each KV head is held by t/nkv
                    neighbouring ranks, its rows replicated there, their gradients summed  Sharded(-1)
    ROWWISE         RowParallelLinear: W[out, in_t], bias whole            output Partial -> g -> Replicated
    VOCAB_PARALLEL  VocabParallelEmbedding / the LM head / the loss: E[V_t, H], vocabulary rows
                    Sharded; the embedding's lookup Replicated (after its g), the head's logits
                    Sharded(-1) (vocabulary), the loss Replicated
    REPLICATED      every rank holds all of it (norms, the position embedding)  Replicated

A new architecture adds a preset and a plan in these styles, and new styles where it needs them
(say latent down-projections REPLICATED, up-projections COLWISE, experts split by expert: a plan
in its own package, read by its own cut and glue).
"""
from tp_from_scratch.sharding import shard_sizes

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
VOCAB_PARALLEL, REPLICATED, COPY_IN = "vocab_parallel", "replicated", "copy_in"

# style -> {parameter of the module: the axis TP splits (None: whole on every rank)}
SPLIT_AXES = {
    COLWISE: {"weight": 0, "bias": 0},      # (out, in): the output rows, and the bias alike
    KV_COLWISE: {"weight": 0, "bias": 0},
    ROWWISE: {"weight": 1, "bias": None},   # (out, in): the input columns; the bias is added after g
    VOCAB_PARALLEL: {"weight": 0},          # (V, H): the vocabulary rows
    REPLICATED: {},
    COPY_IN: {},                            # an input point: no parameters
}

# style -> the layout of a TP module's output, read by the tools that bring each TP module's
# output back to the full tensor to compare it with one device's
REPLICATE, SHARD_LAST = "Replicated", "Sharded(-1)"
OUTPUT_LAYOUT = {
    COPY_IN: REPLICATE,         # f is the identity forward
    COLWISE: SHARD_LAST,        # (..., out/t)
    KV_COLWISE: SHARD_LAST,     # (..., nkv/t*hs); with nkv < t, t/nkv neighbouring ranks hold the same block
    ROWWISE: REPLICATE,         # after g
    VOCAB_PARALLEL: SHARD_LAST,  # the LM head's logits (B, T, V/t); but see VOCAB_OUTPUT_LAYOUT
    REPLICATED: REPLICATE,
}
# the VOCAB_PARALLEL modules by role: the embedding all-reduces its lookup (g) and the loss its
# three sums, so only the head's logits stay Sharded(-1)
VOCAB_OUTPUT_LAYOUT = {"wte": REPLICATE, "lm_head": SHARD_LAST, "cross_entropy": REPLICATE}

_EMBEDDINGS = {"wte": VOCAB_PARALLEL, "wpe": REPLICATED}  # wpe: learned positions only
# attn.copy_in: the one f in front of q, k and v (Megatron's), so backward all-reduces their
# summed input gradient once per block, not three times; mlp.copy_in likewise for gate and up
_ATTENTION = {"blocks.*.ln1": REPLICATED, "blocks.*.attn.copy_in": COPY_IN,
              "blocks.*.attn.q": COLWISE, "blocks.*.attn.k": KV_COLWISE, "blocks.*.attn.v": KV_COLWISE,
              "blocks.*.attn.o": ROWWISE,
              "blocks.*.ln2": REPLICATED}
_GELU_MLP = {"blocks.*.mlp.fc": COLWISE, "blocks.*.mlp.proj": ROWWISE}
_SWIGLU_MLP = {"blocks.*.mlp.copy_in": COPY_IN, "blocks.*.mlp.gate": COLWISE, "blocks.*.mlp.up": COLWISE,
               "blocks.*.mlp.down": ROWWISE}
# copy_in: the f in front of the head, whose vocabulary shards all read ln_f's output (tied or not);
# cross_entropy: the loss of those shards' logits, computed without gathering them
_HEAD = {"ln_f": REPLICATED, "copy_in": COPY_IN, "lm_head": VOCAB_PARALLEL, "cross_entropy": VOCAB_PARALLEL}

# every module (and input point) a config of the architecture may have (a tied model has no
# lm_head, RoPE no wpe)
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


def output_layout(module, arch=None):
    """The layout of ``module``'s output in the TP model (OUTPUT_LAYOUT), e.g. 'blocks.0.attn.q' ->
    'Sharded(-1)', 'wte' -> 'Replicated'; None for a module the plan does not name (replicated)."""
    style = module_style(module, arch)
    if style == VOCAB_PARALLEL:
        return VOCAB_OUTPUT_LAYOUT[module.rpartition(".")[2]]
    return None if style is None else OUTPUT_LAYOUT[style]


def module_style(module, arch=None, plan=None):
    """The plan's style of ``module`` (e.g. 'blocks.3.attn.k' -> KV_COLWISE), or None if the plan
    does not name it (a module outside the GPT, like the ViT's patch embedding: replicated).

    plan: a plan of its own; else ``arch``'s; arch None: any architecture's plan (a module name
    means the same in every plan).
    """
    plans = [plan] if plan is not None else [PLANS[arch]] if arch else PLANS.values()
    for candidates in plans:
        for pattern, style in candidates.items():
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


def _module_of(name):
    """'blocks.0.attn.k.weight' -> 'blocks.0.attn.k'; a module's own name is returned as it is."""
    return name.rpartition(".")[0] if name.rpartition(".")[2] in ("weight", "bias") else name


def kv_replicas(config, tp):
    """How many ranks hold each KV head: 1 when nkv >= t (each rank its own KV heads, evenly or
    not), else t / nkv (nkv < t; GPTConfig.validate demands that nkv divide t then)."""
    return max(1, tp // config.n_kv_heads)


def head_counts(config, tp):
    """(query heads of each rank, KV heads of each distinct KV piece): how t ranks split the heads.

    The KV heads are the unit: a query head must sit on the rank of the KV head it reads (query
    head j reads KV head j // g, g = nh / nkv), so no KV head is cut or sent. With nkv >= t the
    ranks take ⌈nkv/t⌉ or ⌊nkv/t⌋ KV heads each (sharding.shard_sizes: the first nkv % t one more)
    and the g query heads of each; with multi-head attention (g = 1) that is ⌈nh/t⌉ or ⌊nh/t⌋ query
    heads, 52 heads at t = 8 giving 7, 7, 7, 7, 6, 6, 6, 6. With nkv < t each KV head is held by
    r = t / nkv neighbouring ranks, which split its g query heads ⌈g/r⌉ or ⌊g/r⌋. When t divides the
    heads every rank gets nh/t and nkv/t (or one KV head), the even split of the earlier lessons.

    The course's own choice: keeping the KV heads whole costs balance under grouped-query attention
    (nh = 52, nkv = 4 at t = 3: 26, 13, 13 query heads), where splitting the query heads evenly
    would put a KV head on two ranks.
    """
    config.validate(tp)   # a ValueError naming the size that tp cannot split
    nh, nkv = config.n_heads, config.n_kv_heads
    group = nh // nkv
    if nkv >= tp:
        kv = shard_sizes(nkv, tp)
        return [group * n for n in kv], kv
    r = tp // nkv
    return [shard_sizes(group, r)[rank % r] for rank in range(tp)], [1] * nkv


# the modules whose split axis is cut at head boundaries: "q" heads (q's rows, o's columns) or
# "kv" heads (k's and v's rows); every other split is by single rows or columns
HEAD_SPLITS = {"blocks.*.attn.q": "q", "blocks.*.attn.o": "q", "blocks.*.attn.k": "kv", "blocks.*.attn.v": "kv"}


def head_split_sizes(name, config, tp):
    """The sizes of the t / r pieces of a module (or parameter) that attention splits at head
    boundaries (HEAD_SPLITS: q's rows and o's columns by query heads, k's and v's rows by KV heads,
    gpt.arch.head_counts); None for any other name."""
    module = _module_of(name)
    role = next((role for pattern, role in HEAD_SPLITS.items() if _matches(pattern, module)), None)
    if role is None:
        return None
    q, kv = head_counts(config, tp)
    return [n * config.head_size for n in (q if role == "q" else kv)]


def split_sizes(name, config, tp, size):
    """The sizes, along shard_axis(name), of the t / r distinct pieces of parameter (or module)
    ``name`` whose full size along that axis is ``size``; piece i is held by ranks i*r .. i*r+r-1
    (r = replicas_of(name)). Heads stay whole (head_split_sizes); the rest splits like
    numpy.array_split (sharding.shard_sizes), as the vocabulary always has."""
    heads = head_split_sizes(name, config, tp)
    return heads if heads is not None else shard_sizes(size, tp // replicas_of(name, config, tp))


def replicas_of(name, config, tp):
    """How many neighbouring ranks hold the same piece of parameter (or module) ``name``: t/nkv
    for k, v when nkv < t, else 1."""
    module = _module_of(name)
    return kv_replicas(config, tp) if module_style(module, config.arch) == KV_COLWISE else 1


def plan_modules(arch, style, n_layers):
    """The module names of ``arch``'s plan with ``style``, '*' expanded over n_layers blocks."""
    names = []
    for pattern, s in PLANS[arch].items():
        if s == style:
            names += [pattern.replace("*", str(i)) for i in range(n_layers)] if "*" in pattern else [pattern]
    return names
