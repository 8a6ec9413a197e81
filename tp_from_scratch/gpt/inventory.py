"""What one rank of the tensor-parallel GPT holds and sends: its parameters, and the collectives
of one training step. Counted from the architecture (gpt.arch), not from a built model, so a
model too large to build can be counted too (a planner reads both; this lesson's step ledger,
gpt.step, reads the collectives).

    parameters(config)                  [Tensor(name, rows, cols, split, copies, matmul, pieces)]
    parameter_count(config, t=, rank=)  the exact count of the model, or of one TP rank's shard
    collective_calls(config, t, batch)  [Call(where, group, calls, elements)] of one step
"""
from dataclasses import dataclass, field
from functools import partial

from tp_from_scratch.gpt.arch import ARCHS, KV_COLWISE, PLANS, SPLIT_AXES, head_split_sizes
from tp_from_scratch.sharding import shard_sizes

# ---------------------------------------------------------------------------------------
# Parameters: every tensor of the model, with the axis TP splits
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    """A parameter of shape (rows, cols), ``copies`` of it (one per layer for block parameters).

    split: True when TP cuts ``rows`` over the ranks (column weights by output, row weights by
    input, embeddings by vocabulary); False when every rank holds all of it (norms, row biases).
    matmul: True when the forward multiplies every token by it (2 FLOPs per element per token).
    pieces: the most pieces ``rows`` may be cut into (0: no limit). k and v have one piece per
    KV head: with t > nkv ranks, each KV head is held whole by t / nkv neighbouring ranks.
    heads: for attention's q, k, v, o, t -> the sizes of the pieces (gpt.arch.head_split_sizes:
    whole heads, ⌈n/t⌉ or ⌊n/t⌋ when t does not divide them); None: cut like numpy.array_split.
    """
    name: str
    rows: int
    cols: int = 1
    split: bool = False
    copies: int = 1
    matmul: bool = False
    pieces: int = 0
    heads: object = field(default=None, repr=False, compare=False)   # t -> the pieces' sizes, for
                                                                      # rows cut at head boundaries

    def replicas(self, t):
        """How many ranks hold the same piece: t / pieces when t exceeds ``pieces``, else 1."""
        return max(1, t // self.pieces) if self.split and self.pieces else 1

    def count(self, t=1, rank=0):
        """Elements on TP rank ``rank`` of ``t`` (uneven splits like numpy.array_split)."""
        r = self.replicas(t)
        if not self.split:
            rows = self.rows
        else:
            rows = (self.heads(t) if self.heads else shard_sizes(self.rows, t // r))[rank // r]
        return self.copies * rows * self.cols


def architecture(config, arch=None):
    """{norm, position, mlp, bias, key_bias, tie_embeddings, ...} of ``config`` built as ``arch``.

    arch None: the config's own (``config.arch``). Another arch: its preset (gpt.arch.ARCHS),
    so a config of the course's GPT can be counted as GPT-2 or Llama of the same sizes.
    """
    own = getattr(config, "arch", "gpt")
    arch = arch or own
    if arch not in ARCHS:
        raise ValueError(f"arch {arch!r} is not one of {tuple(ARCHS)}")
    fields = dict(ARCHS[arch])
    if arch == own:
        fields.update({k: getattr(config, k) for k in fields if getattr(config, k, None) is not None})
    return dict(fields, arch=arch)


def module_shapes(config, a):
    """{module name (as in the plan): (out, in, has bias)} for a linear or embedding, or
    (H, None, has bias) for a norm; modules the architecture lacks are left out."""
    H, F = config.hidden, config.ffn
    q, kv = config.n_heads * config.head_size, config.n_kv_heads * config.head_size
    norm = (H, None, a["norm"] == "layernorm")  # LayerNorm: weight and bias; RMSNorm: weight only
    shapes = {"wte": (config.vocab_size, H, False), "blocks.*.ln1": norm,
              "blocks.*.attn.q": (q, H, a["bias"]), "blocks.*.attn.k": (kv, H, a["bias"] and a["key_bias"]),
              "blocks.*.attn.v": (kv, H, a["bias"]), "blocks.*.attn.o": (H, q, a["bias"]),
              "blocks.*.ln2": norm, "blocks.*.mlp.fc": (F, H, a["bias"]), "blocks.*.mlp.proj": (H, F, a["bias"]),
              "blocks.*.mlp.gate": (F, H, a["bias"]), "blocks.*.mlp.up": (F, H, a["bias"]),
              "blocks.*.mlp.down": (H, F, a["bias"]), "ln_f": norm}
    if a["position"] == "learned":
        shapes["wpe"] = (config.seq_len, H, False)
    if not a["tie_embeddings"]:
        shapes["lm_head"] = (config.vocab_size, H, False)
    return shapes


_LOOKUPS = ("wte", "wpe")  # the embeddings: looked up, not multiplied (the tied head is counted apart)


def parameters(config, arch=None):
    """Every parameter of the model described by ``config`` (a GPTConfig), as Tensors, in the
    order of the architecture's sharding plan, each split as the plan says (gpt.arch.PLANS).

    Names as in tp_from_scratch.gpt.model (``attn.q.weight``, ``mlp.fc.weight``, ...), without
    the ``blocks.i.`` of block parameters (one Tensor with copies = L stands for all blocks).
    """
    a = architecture(config, arch)
    shapes = module_shapes(config, a)
    out = []
    for module, style in PLANS[a["arch"]].items():
        if module not in shapes:
            continue
        n_out, n_in, bias = shapes[module]
        in_blocks = module.startswith("blocks.*.")
        name, copies = module.removeprefix("blocks.*."), config.n_layers if in_blocks else 1
        pieces = config.n_kv_heads if style == KV_COLWISE else 0
        axes = SPLIT_AXES[style]
        if n_in is None:  # a norm: weight (and bias) of H, whole on every rank
            out += [Tensor(f"{name}.{leaf}", n_out, copies=copies) for leaf in ("weight", "bias")[:1 + bias]]
            continue
        # rows: the axis TP splits (the input features of a row-parallel weight)
        rows, cols = (n_in, n_out) if axes.get("weight") == 1 else (n_out, n_in)
        heads = partial(head_split_sizes, module, config) if head_split_sizes(module, config, 1) else None
        out.append(Tensor(f"{name}.weight", rows, cols, axes.get("weight") is not None, copies,
                          matmul=module not in _LOOKUPS, pieces=pieces, heads=heads))
        if bias:
            split = axes.get("bias") is not None
            out.append(Tensor(f"{name}.bias", n_out, 1, split, copies, pieces=pieces if split else 0,
                              heads=heads if split else None))
    return out


def parameter_count(config, arch=None, t=1, rank=0):
    """Exact number of parameters: of the whole model (t=1), or held by TP rank ``rank`` of ``t``."""
    return sum(p.count(t, rank) for p in parameters(config, arch))


def rounded(n):
    """1,213,479,936 -> '1.2B' as Megatron-LM's Table 1 writes it; millions as '124M'."""
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M"
    return f"{n / 1e3:.0f}K" if n >= 1e3 else str(n)


# ---------------------------------------------------------------------------------------
# Communication: the collectives our trainer calls in one step
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    """``calls`` all-reduces of ``elements`` numbers each over ``group`` ("tp" or "dp")."""
    where: str
    group: str
    calls: int
    elements: int
    collective: str = "all_reduce"


def collective_calls(config, t, batch, dp=1, arch=None, tp_rank=0):
    """The collectives one step of tp_from_scratch.gpt.train makes on one rank.

    ``batch`` is the global batch (the trainer splits it over dp); N = B/dp * T tokens.
    Per step, whatever t is (at t = 1 they are still called, and send nothing):
      forward: g of the vocab-parallel embedding; g after attention's o and after the MLP's
               proj in each block; cross-entropy's three all-reduces of N numbers (max,
               target logit, sum of exponentials);
      backward: f before q/k/v and f inside fc in each block; f before the LM head.
    With t > nkv, each KV head lives on t/nkv ranks, and backward sums the gradient of each of
    its weights (k.weight, v.weight, v.bias) over them: one all-reduce per weight and layer of
    a buffer with a slot per KV head, nkv times the local weight (nn.mappings.sum_over_replicas).
    With dp > 1: one all-reduce of every local gradient (flattened), and one of the loss.
    """
    L, H = config.n_layers, config.hidden
    tokens = batch // dp * config.seq_len
    calls = [Call("embedding g (forward)", "tp", 1, tokens * H),
             Call("attention o: g (forward)", "tp", L, tokens * H),
             Call("mlp proj: g (forward)", "tp", L, tokens * H),
             Call("cross-entropy max, target, sum-exp (forward)", "tp", 3, tokens),
             Call("LM head f (backward)", "tp", 1, tokens * H),
             Call("q, k, v f (backward)", "tp", L, tokens * H),
             Call("mlp fc f (backward)", "tp", L, tokens * H)]
    for p in parameters(config, arch):
        if p.replicas(t) > 1:  # a slot for every distinct piece: t / replicas x the local piece
            calls.append(Call(f"{p.name} grad over KV replicas (backward)", "tp", p.copies,
                              t // p.replicas(t) * p.count(t, tp_rank) // p.copies))
    if dp > 1:
        calls += [Call("gradient average", "dp", 1, parameter_count(config, arch, t, tp_rank)),
                  Call("loss average", "dp", 1, 1)]
    return calls
