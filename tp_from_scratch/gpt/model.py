"""The GPT on one device, the reference every tensor-parallel run is checked against.

It is written like nanoGPT's model.py: nn.Linear and nn.Embedding where they are used, and
nothing of tensor parallelism. gpt.parallelize turns it into the TP model by the
architecture's sharding plan (gpt.arch.PLANS), swapping each planned module for Lesson 5's
layer and keeping this rank's shard of its weights:

    single device      nn.Linear             nn.Linear            nn.Embedding    nn.CrossEntropyLoss
    tensor-parallel    ColumnParallelLinear  RowParallelLinear    VocabParallel-  vocab-parallel
                       (q, k, v, fc)         (o, proj)            Embedding       cross-entropy

so whatever the TP model computes differently is exactly the parallel layers' doing. Per block,
with t TP ranks (Megatron's f / g pair; f sits at the ``copy_in`` points, the identity here):

    x (B, T, H) Replicated --f--> q (B, T, nh/t*hs), k and v (B, T, nkv/t*hs): Sharded heads
        --attention, per head--> (B, T, nh/t*hs) --o (row)--> Partial --g--> (B, T, H) Replicated
    x --f--> fc (column): (B, T, F/t) --GeLU--> proj (row): Partial --g--> (B, T, H) Replicated

(nh/t, nkv/t and F/t when t divides them; otherwise ranks hold ⌈nkv/t⌉ or ⌊nkv/t⌋ whole KV heads
with the query heads that read them, and ⌈F/t⌉ or ⌊F/t⌋ columns: gpt.arch.head_counts, split_sizes.)

With fewer KV heads than ranks (nkv < t, as in Llama 3 70B's 8 KV heads at t = 8 or more),
each KV head is held by t/nkv neighbouring ranks: k and v are (B, T, hs) on every rank, its
weight rows are replicated over those ranks, and their gradients are summed among them
(``nn.mappings.sum_over_replicas``), as the numpy attention of Lesson 4 does.

Weights use torch's layout, (out, in); a state dict has the same keys in both models, the
TP one holding each rank's shard (gpt.parallelize's ``shard_state_dict`` / ``unshard_state_dict``).

Three architectures come out of the one Block, chosen by ``GPTConfig.arch`` (a preset for the
fields norm, position, mlp, gelu, bias, key_bias, norm_eps, tie_embeddings):

    arch    norm                 position          MLP                        biases         head
    gpt     LayerNorm            learned (wpe)     fc -> GeLU (erf) -> proj   all but key    tied
    gpt2    LayerNorm eps 1e-5   learned (wpe)     fc -> GeLU (tanh) -> proj  all, key too   tied
    llama   RMSNorm eps 1e-6     RoPE, per head    SwiGLU: down(silu(gate) *  none           untied
                                                   up)

"gpt" is the course's own model and the default. The presets, and which module each architecture
splits how (its sharding plan), are in gpt/arch.py. RoPE rotates q and k of each head by its
position, so a rank that holds a head rotates it by itself: no communication. SwiGLU's gate and
up are column-parallel (one f for both), down is row-parallel: one all-reduce (g), as for the
GeLU MLP.
"""
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from tp_from_scratch.gpt.arch import ARCHS

GELUS = {"erf": "none", "tanh": "tanh"}  # config name -> F.gelu's ``approximate``
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope")
MLPS = ("gelu", "swiglu")


@dataclass
class GPTConfig:
    """Model sizes. Defaults are tiny: the model trains in about a minute on 2 CPU cores."""
    vocab_size: int = 67        # V; 67 is prime, so every tp > 1 splits the vocabulary unevenly
    seq_len: int = 32           # T, the longest sequence (size of the position embedding)
    n_layers: int = 2
    hidden: int = 64            # H
    n_heads: int = 8            # nh; head size hs = H / nh
    n_kv_heads: int = 4         # grouped-query attention: nh / nkv query heads share a k, v head
    ffn: int = 0                # F; 0 means 4 * H
    tie_embeddings: bool = None  # the LM head reuses the token embedding's weight (None: arch's)
    gelu: str = None            # "erf": exact GeLU (torch's default); "tanh": GPT-2's approximation
                                # ("gelu_new"), the form the numpy layers of Lessons 3-4 use
    # the architecture: a preset for every field below left at None (gpt.arch.ARCHS)
    arch: str = "gpt"           # "gpt" (this course's model), "gpt2" or "llama"
    norm: str = None            # "layernorm" or "rmsnorm"
    norm_eps: float = None      # the norms' epsilon
    position: str = None        # "learned" (a wpe table of seq_len rows) or "rope"
    rope_theta: float = 10000.0  # RoPE's base: head pair i turns by position * theta^(-2i/hs)
    mlp: str = None             # "gelu" (fc, proj) or "swiglu" (gate, up, down)
    bias: bool = None           # biases on the linear layers
    key_bias: bool = None       # a bias on k as well (GPT-2 has one; softmax ignores it, see Attention)
    causal: bool = True         # False: every position attends to every other (the ViT, gpt/vit.py)
    pad_token_id: int = None    # a token whose embedding row gets no gradient (nn.Embedding's
                                # padding_idx; a Llama import's pad_token_id, as transformers reads it)

    def __post_init__(self):
        if self.ffn == 0:
            self.ffn = 4 * self.hidden
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {sorted(ARCHS)}, got {self.arch!r}")
        for name, value in ARCHS[self.arch].items():
            if getattr(self, name) is None:
                setattr(self, name, value)

    @property
    def head_size(self):
        return self.hidden // self.n_heads

    def to_dict(self):
        return asdict(self)

    def validate(self, tp=1):
        """Raise a ValueError naming the first size that is wrong on its own or for ``tp`` ranks."""
        for name in ("vocab_size", "seq_len", "n_layers", "hidden", "n_heads", "n_kv_heads", "ffn"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.hidden % self.n_heads != 0:
            raise ValueError(f"hidden size {self.hidden} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.gelu not in GELUS:
            raise ValueError(f"gelu must be one of {sorted(GELUS)}, got {self.gelu!r}")
        for name, allowed in (("norm", NORMS), ("position", POSITIONS), ("mlp", MLPS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        if self.position == "rope" and self.head_size % 2 != 0:
            raise ValueError(f"RoPE turns pairs of a head's dimensions: head size {self.head_size} is odd")
        if self.pad_token_id is not None and not (type(self.pad_token_id) is int
                                                  and 0 <= self.pad_token_id < self.vocab_size):
            raise ValueError(f"pad_token_id {self.pad_token_id!r} is not a token id in [0, vocab_size="
                             f"{self.vocab_size})")
        if tp < 1:
            raise ValueError(f"tp must be at least 1, got {tp}")
        for name, size in [("ffn size", self.ffn), ("vocab size", self.vocab_size), ("n_heads", self.n_heads)]:
            if tp > size:
                raise ValueError(f"tp={tp} is larger than {name} {size}: every rank needs at least one")
        if tp > self.n_kv_heads and tp % self.n_kv_heads != 0:  # each KV head is then held by tp / nkv ranks
            raise ValueError(f"tp={tp} is larger than n_kv_heads {self.n_kv_heads} but not a multiple of it: "
                             f"each KV head is held whole by tp / n_kv_heads ranks, so that number must be whole "
                             f"(a query head reads its KV head on its own rank)")
        # the heads (whole), the KV heads, the FFN width and the vocabulary may split unevenly:
        # ranks hold ⌈n/t⌉ or ⌊n/t⌋ (gpt.arch.split_sizes, head_counts)

    def check_even(self, tp, who):
        """Raise a ValueError naming the first size tp does not divide, for ``who``: a layer set
        that splits heads, KV heads and the FFN width only evenly (the vocabulary may be uneven)."""
        sizes = [("n_heads", self.n_heads), ("ffn size", self.ffn)]
        for name, size in sizes + ([("n_kv_heads", self.n_kv_heads)] if tp <= self.n_kv_heads else []):
            if size % tp:
                raise ValueError(f"{name} {size} is not divisible by tp={tp}: {who} splits it only evenly")


def rope_tables(positions, head_size, theta, dtype):
    """(cos, sin), each (T, hs), for rotary position embeddings at ``positions`` (T,).

    Head dimensions i and i + hs/2 form a pair turned by the angle position * theta^(-2i/hs)
    (the "rotate half" layout of Hugging Face's Llama). Computed in float64, then cast.
    """
    inv_freq = theta ** (-torch.arange(0, head_size, 2, dtype=torch.float64, device=positions.device)
                         / head_size)                                  # (hs/2,)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # (T, hs/2)
    angles = torch.cat([angles, angles], dim=-1)                       # (T, hs)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x, cos, sin):
    """Rotate every head of x (B, n, T, hs) by its position: x cos + rotate_half(x) sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class KVCache:
    """Keys and values of the tokens seen so far, one (k, v) pair per layer, for generation.

    Each entry is (B, nkv_local, T_seen, hs): in the TP model a rank caches only the KV heads
    it holds (Sharded by heads like the attention; a replicated KV head when nkv < t), so the
    cache is split like the weights and decoding needs no extra communication.
    """

    def __init__(self, n_layers):
        self.k = [None] * n_layers
        self.v = [None] * n_layers

    def __len__(self):
        """Tokens cached so far (the position of the next token)."""
        return 0 if self.k[0] is None else self.k[0].shape[2]

    def layer(self, i):
        return _LayerCache(self, i)


class _LayerCache:
    def __init__(self, cache, i):
        self.cache, self.i = cache, i

    def start(self):
        k = self.cache.k[self.i]
        return 0 if k is None else k.shape[2]

    def append(self, k, v):                            # k, v (B, nkv, T_new, hs)
        c, i = self.cache, self.i
        c.k[i] = k if c.k[i] is None else torch.cat([c.k[i], k], dim=2)
        c.v[i] = v if c.v[i] is None else torch.cat([c.v[i], v], dim=2)
        return c.k[i], c.v[i]                          # (B, nkv, T_seen, hs)


def causal_self_attention(q, k, v, head_size, rope=None, cache=None, causal=True):
    """softmax(q k^T / sqrt(hs) + causal mask) v for the heads this rank holds.

    q (B, T, nq*hs), k and v (B, T, nkv*hs) -> (B, T, nq*hs). The head counts are read off
    the shapes, so the same code serves the full model (nq = nh) and a TP shard (the heads this
    rank holds, gpt.arch.head_counts: nh/t, or ⌈⌉ / ⌊⌋ of whole KV groups when t does not divide):
    the q heads of a shard use exactly the kv heads of the same shard (Sharded by heads; one
    replicated KV head when nkv < t). ``rope``: (cos, sin) of the T new positions, applied
    to q and k per head. ``cache``: a layer of a KVCache; the T new tokens come after the
    ones it holds and attend to them too. ``causal=False``: no mask (bidirectional).
    """
    B, T, _ = q.shape
    q = q.view(B, T, -1, head_size).transpose(1, 2)   # (B, nq, T, hs)
    k = k.view(B, T, -1, head_size).transpose(1, 2)   # (B, nkv, T, hs)
    v = v.view(B, T, -1, head_size).transpose(1, 2)   # (B, nkv, T, hs)
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    if cache is not None:
        k, v = cache.append(k, v)                      # (B, nkv, Tk, hs), Tk = seen + T
    Tk = k.shape[2]
    group = q.shape[1] // k.shape[1]
    # GQA: q head j reads kv head j // group
    k = k.repeat_interleave(group, dim=1)              # (B, nq, Tk, hs)
    v = v.repeat_interleave(group, dim=1)              # (B, nq, Tk, hs)
    att = (q @ k.transpose(-2, -1)) * head_size ** -0.5  # (B, nq, T, Tk)
    if causal:
        # new token i sits at position Tk - T + i and sees keys 0 .. Tk - T + i
        mask = torch.ones(T, Tk, dtype=torch.bool, device=q.device).tril(diagonal=Tk - T)
        att = att.masked_fill(~mask, float("-inf"))
    att = att.softmax(dim=-1)
    y = att @ v                                        # (B, nq, T, hs)
    return y.transpose(1, 2).reshape(B, T, -1)         # (B, T, nq*hs)


def _identity(x):
    return x


class Attention(nn.Module):
    """q, k, v projections, attention per head, o projection: (B, T, H) -> (B, T, H).

    ``copy_in`` is the point where q, k and v start reading x: the identity here; tensor
    parallelism (gpt.parallelize) puts Megatron's f there, ONE for all three, so backward
    all-reduces their summed input gradient once per block instead of three times.
    """

    def __init__(self, config):
        super().__init__()
        hs, H = config.head_size, config.hidden
        self.head_size = hs
        self.rope = config.position == "rope"
        self.rope_theta = config.rope_theta
        self.causal = config.causal
        self.copy_in = _identity  # a plain function, not a module: TP (or Exercise 6) sets any function here
        self.q = nn.Linear(H, config.n_heads * hs, bias=config.bias)
        # by default no key bias: it adds q.b_k to a whole row of scores, which softmax ignores,
        # so its gradient is exactly zero and Adam would turn the roundoff left in it into real
        # steps. GPT-2 has one (key_bias=True): imported checkpoints keep it, and it changes
        # neither the loss nor any other gradient (tests/test_arch.py proves it)
        self.k = nn.Linear(H, config.n_kv_heads * hs, bias=config.bias and config.key_bias)
        self.v = nn.Linear(H, config.n_kv_heads * hs, bias=config.bias)
        self.o = nn.Linear(config.n_heads * hs, H, bias=config.bias)

    def forward(self, x, cache=None):                   # x (B, T, H)
        x = self.copy_in(x)                             # TP: f, identity forward, all-reduce backward
        rope = None
        if self.rope:  # each head is turned by its own positions: local to the rank holding it
            start = 0 if cache is None else cache.start()
            positions = torch.arange(start, start + x.shape[1], device=x.device)
            rope = rope_tables(positions, self.head_size, self.rope_theta, x.dtype)
        y = causal_self_attention(self.q(x), self.k(x), self.v(x), self.head_size, rope, cache, self.causal)
        return self.o(y)                                # (B, T, H)


class MLP(nn.Module):
    """fc -> GeLU -> proj; or, with mlp="swiglu", silu(gate) * up -> down: (B, T, H) -> (B, T, H).

    SwiGLU's gate and up read one x: their ``copy_in`` point is where TP puts one f for both,
    as for q, k and v. fc alone reads x in the GeLU MLP, so its layer applies its own f.
    """

    def __init__(self, config):
        super().__init__()
        H, F_ = config.hidden, config.ffn
        self.approximate = GELUS[config.gelu]
        self.swiglu = config.mlp == "swiglu"
        if self.swiglu:
            self.copy_in = _identity
            self.gate = nn.Linear(H, F_, bias=config.bias)
            self.up = nn.Linear(H, F_, bias=config.bias)
            self.down = nn.Linear(F_, H, bias=config.bias)
        else:
            self.fc = nn.Linear(H, F_, bias=config.bias)
            self.proj = nn.Linear(F_, H, bias=config.bias)

    def forward(self, x):                               # x (B, T, H)
        if self.swiglu:
            x = self.copy_in(x)
            h = F.silu(self.gate(x)) * self.up(x)       # (B, T, F); TP: (B, T, F/t), element-wise on the shards
            return self.down(h)
        h = F.gelu(self.fc(x), approximate=self.approximate)  # (B, T, F); TP: GeLU acts on (B, T, F/t)
        return self.proj(h)


def make_norm(config, **kw):
    """The config's norm over H: LayerNorm (weight, bias) or RMSNorm (weight only); replicated."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.hidden, eps=config.norm_eps, **kw)
    return nn.LayerNorm(config.hidden, eps=config.norm_eps, **kw)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(self, config):
        super().__init__()
        self.ln1 = make_norm(config)
        self.attn = Attention(config)
        self.ln2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x, cache=None):
        x = x + self.attn(self.ln1(x), cache)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """The single-device reference: returns (logits (B, T, V), mean cross-entropy or None).

    After gpt.parallelize: (this rank's logits (B, T, V/t) Sharded(vocab), the same loss).
    """

    def __init__(self, config):
        super().__init__()
        config.validate(1)
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.hidden, padding_idx=config.pad_token_id)
        if config.position == "learned":
            self.wpe = nn.Embedding(config.seq_len, config.hidden)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = make_norm(config)
        # the head's input point: TP puts f here, since every vocabulary shard of the head reads x
        self.copy_in = _identity
        if not config.tie_embeddings:
            self.lm_head = nn.Linear(config.hidden, config.vocab_size, bias=False)
        # a module, so that the plan can name it: TP computes it on the vocabulary shards
        self.cross_entropy = nn.CrossEntropyLoss()

    def head_weight(self):
        return self.wte.weight if self.config.tie_embeddings else self.lm_head.weight  # (V, H); TP: (V/t, H)

    def forward(self, idx, targets=None, cache=None):   # idx (B, T) token ids
        x = embed(self, idx, cache)                     # (B, T, H)
        for i, block in enumerate(self.blocks):
            x = block(x, None if cache is None else cache.layer(i))
        x = self.copy_in(self.ln_f(x))                  # TP: f, all-reducing the head's partial dx
        logits = F.linear(x, self.head_weight())        # (B, T, V)
        if targets is None:
            return logits, None
        return logits, self.cross_entropy(logits.flatten(0, 1), targets.flatten())


def embed(model, idx, cache=None):
    """Token embeddings, plus learned positions (continuing after the cached tokens)."""
    x = model.wte(idx)                                  # (B, T, H)
    if model.config.position != "learned":
        return x                                        # RoPE acts inside attention
    start = 0 if cache is None else len(cache)
    if start + idx.shape[1] > model.config.seq_len:
        raise ValueError(f"position {start + idx.shape[1] - 1} is past the last learned position "
                         f"{model.config.seq_len - 1} (seq_len {model.config.seq_len})")
    return x + model.wpe(torch.arange(start, start + idx.shape[1], device=idx.device))


def init_gpt(config, seed, dtype=torch.float32):
    """A GPT with reproducible weights: N(0, 0.02), residual projections scaled by 1/sqrt(2 layers).

    Draws from its own torch.Generator, so building a model never touches the global RNG.
    """
    residual = 0.02 / (2 * config.n_layers) ** 0.5
    return init_weights(GPT(config).to(dtype), seed, lambda name: residual if name.endswith(
        ("o.weight", "proj.weight", "down.weight")) else 0.02)


def init_weights(model, seed, std_of):
    """Fill ``model`` in place from its own generator: zero biases, unit norm weights, and every
    other weight N(0, std_of(name)^2), drawn in float64 in parameter order. Returns ``model``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("ln_f"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * std_of(name))
    return model


def count_parameters(model):
    """Number of parameter elements and their bytes in ``model`` (a rank counts only its shard:
    a DTensor parameter counts its local tensor, not the global shape it describes)."""
    params = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    return sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params)
