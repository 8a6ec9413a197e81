"""Multi-head latent attention (MLA, DeepSeek-V2/V3) on one device, and how TP splits its heads.

One device, per token x (H,), nh heads (DeepSeek-V3 report, eqs. 1-11):

    c_q  = RMSNorm(W_qa x)                       (q_lora,)      the query latent
    q    = W_qb c_q -> per head [q_nope | q_rope]               (nh, nope + rope)
    [c_kv | k_rope] = W_kva x                    (kv_lora + rope,)
    c_kv = RMSNorm(c_kv)                                        the KV latent: what the cache stores
    [k_nope | v] = W_kvb c_kv -> per head                       (nh, nope + v)
    k    = [k_nope | RoPE(k_rope)]  (one rope key shared by all heads: "decoupled RoPE")
    q    = [q_nope | RoPE(q_rope)]
    out  = W_o concat_h softmax(q_h k_h^T / sqrt(nope + rope)) v_h

On t ranks (Lesson 4's split, by heads; model.parallelize applies it from the plan, arch.PLANS):
    W_qb, W_kvb   column-parallel: rank r holds the rows of its nh/t heads (W_q likewise when
                  q_lora_rank is None: queries straight from x, no query latent)
    W_o           row-parallel: a partial sum, all-reduced (g)
    W_qa, W_kva and both RMSNorms replicated: every rank computes the same latents. Each
    rank's heads then read them, so the latents' gradients are partial: f sits on the
    latents (MLA's ``copy_in`` point, planned COPY_IN; one all-reduce of q_lora + kv_lora + rope numbers per token in backward, fewer
    than H), and everything before it (the replicated weights, x) gets full gradients with
    no further collective: Lesson 8's rule, the sum goes where the ranks start to differ.

The cache of generation holds [c_kv | RoPE(k_rope)] per token: kv_lora + rope numbers on
EVERY rank, whatever t (the latent is not split; the heads are expanded from it each step).

RoPE is plain (angle p / theta^(2i/rope)) or YaRN, which DeepSeek-V3 uses to stretch its 4K
pre-training context to 128K (report §4.3; Peng et al., arXiv 2309.00071): see rope_frequencies.
"""
import math

import torch
from torch import nn



class RMSNorm(nn.Module):
    """weight * x / sqrt(mean(x^2) + eps), in the input's dtype."""

    def __init__(self, size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def yarn_mscale(factor, mscale=1.0):
    """YaRN's attention temperature for a context stretched ``factor`` times: 0.1 mscale ln(factor) + 1."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_frequencies(config, dtype=torch.float64):
    """(inverse frequencies (rope/2,), cos/sin multiplier, softmax-scale multiplier) of the config's RoPE.

    Plain: frequency i is theta^(-2i/rope), both multipliers 1.
    YaRN ("NTK-by-parts"), in the config's rope_parameters (transformers' names):
      * a pair that turns fewer than beta_slow times over the original context L
        (original_max_position_embeddings) is interpolated: its frequency divided by ``factor``;
        one that turns more than beta_fast times keeps
        its frequency (extrapolated); between them a linear ramp over the pair index, from the
        index where a pair turns beta_fast times to where it turns beta_slow times (rounded
        outwards unless truncate is false);
      * the softmax scale is multiplied by yarn_mscale(factor, mscale_all_dim)^2 when
        mscale_all_dim is set (DeepSeek's form), and cos/sin by attention_factor (default
        yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim), or yarn_mscale(factor)
        without them): 1 for DeepSeek-V3, whose mscale = mscale_all_dim = 1.
    """
    params, dim = config.rope_parameters, config.qk_rope_head_dim
    theta = params["rope_theta"]
    plain = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if params.get("rope_type", "default") == "default":
        return plain.to(dtype), 1.0, 1.0
    original = params["original_max_position_embeddings"]
    factor = params["factor"]
    fast, slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def pair_turning(turns):   # the (fractional) pair index whose wavelength fits L / turns times
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = pair_turning(fast), pair_turning(slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high if high != low else high + 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)  # 0 keep, 1 stretch
    frequencies = plain * (1 - ramp) + plain / factor * ramp
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    cos_sin = params.get("attention_factor")
    if cos_sin is None:
        cos_sin = (yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim) if mscale and mscale_all_dim
                   else yarn_mscale(factor))
    softmax = yarn_mscale(factor, mscale_all_dim) ** 2 if mscale_all_dim else 1.0
    return frequencies.to(dtype), float(cos_sin), softmax


def rope_angles(positions, inv_freq, multiplier=1.0):
    """(T,) positions -> (cos, sin), each (T, rope/2): angle p x frequency i, times ``multiplier``."""
    angles = positions.to(inv_freq.dtype)[:, None] * inv_freq
    return angles.cos() * multiplier, angles.sin() * multiplier


def apply_rope(x, cos, sin, interleave):
    """Rotate pairs of x (..., T, dim) by the angles; DeepSeek pairs neighbours (x0, x1), ...
    (interleave) and, like transformers, writes the rotated evens then the rotated odds
    (q and k permuted alike: their dot product is that of the interleaved layout)."""
    a, b = (x[..., 0::2], x[..., 1::2]) if interleave else x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


class LatentCache:
    """The KV cache of MLA: per layer, [c_kv | RoPE(k_rope)] of every token so far, (B, T, kv_lora + rope)."""

    def __init__(self):
        self.layers = {}

    def extend(self, layer, latent):
        old = self.layers.get(layer)
        self.layers[layer] = latent if old is None else torch.cat([old, latent], dim=1)
        return self.layers[layer]

    def length(self):
        return next(iter(self.layers.values())).shape[1] if self.layers else 0

    def nbytes(self):
        return sum(v.numel() * v.element_size() for v in self.layers.values())


def _identity(x):
    return x


class MLA(nn.Module):
    """MLA on one device, all nh heads: (B, T, H) -> (B, T, H).

    Parameters under transformers' names (q_a_proj, q_a_layernorm, q_b_proj,
    kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj). ``copy_in`` is the point where the
    heads start reading the latents: the identity here; model.parallelize puts f there (the
    plan's COPY_IN), turns q_b / kv_b (q_proj) into column-parallel layers that skip their own
    f, and o into a row-parallel one (its g). The forward reads the number of heads it holds
    from q_b's (q's) weight, so the same code runs all nh heads or a rank's nh/t.
    """

    def __init__(self, config, layer_index=0):
        super().__init__()
        self.layer_index = layer_index
        self.nope, self.rope, self.v = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        self.kv_lora, self.q_lora = config.kv_lora_rank, config.q_lora_rank
        self.interleave = config.rope_interleave
        inv_freq, self.rope_multiplier, softmax = rope_frequencies(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # follows .to(dtype); not in state dicts
        self.softmax_scale = softmax / math.sqrt(self.nope + self.rope)
        self.copy_in = _identity  # a plain function, not a module: TP sets f here
        H, h = config.hidden_size, config.num_attention_heads  # no attention biases (model.check_config)
        if self.q_lora:
            self.q_a_proj = nn.Linear(H, self.q_lora, bias=False)
            self.q_a_layernorm = RMSNorm(self.q_lora)  # transformers keeps these at eps 1e-6
            self.q_b_proj = nn.Linear(self.q_lora, h * (self.nope + self.rope), bias=False)
        else:   # q_lora_rank=None (DeepSeek-V2-Lite's form): no query latent, q_proj splits like q_b_proj
            self.q_proj = nn.Linear(H, h * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(H, self.kv_lora + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_lora)
        self.kv_b_proj = nn.Linear(self.kv_lora, h * (self.nope + self.v), bias=False)
        self.o_proj = nn.Linear(h * self.v, H, bias=False)

    def forward(self, x, positions, cache=None):
        B, T, _ = x.shape
        # (B, T, q_lora) replicated; without a query latent the heads read x itself
        q_latent = self.q_a_layernorm(self.q_a_proj(x)) if self.q_lora else x
        q_width = q_latent.shape[-1]
        c_kv, k_rope = self.kv_a_proj_with_mqa(x).split([self.kv_lora, self.rope], dim=-1)
        cos, sin = rope_angles(positions.to(x.device), self.inv_freq, self.rope_multiplier)  # (T, rope/2)
        latent = torch.cat([self.kv_a_layernorm(c_kv), apply_rope(k_rope, cos, sin, self.interleave)], -1)
        # TP: f on the latents, where the ranks diverge (each its own heads); one all-reduce backward
        both = self.copy_in(torch.cat([q_latent, latent], dim=-1))
        q_latent, latent = both.split([q_width, self.kv_lora + self.rope], dim=-1)
        if cache is not None:
            latent = cache.extend(self.layer_index, latent)  # (B, S, kv_lora + rope), S = past + T
        q_up = self.q_b_proj if self.q_lora else self.q_proj
        S, h = latent.shape[1], q_up.weight.shape[0] // (self.nope + self.rope)  # the heads held here
        q = q_up(q_latent).view(B, T, h, self.nope + self.rope).transpose(1, 2)  # (B, h, T, qk)
        q_nope, q_rope = q.split([self.nope, self.rope], dim=-1)
        q = torch.cat([q_nope, apply_rope(q_rope, cos, sin, self.interleave)], dim=-1)
        c_kv, k_rope = latent.split([self.kv_lora, self.rope], dim=-1)
        kv = self.kv_b_proj(c_kv).view(B, S, h, self.nope + self.v).transpose(1, 2)  # (B, h, S, nope + v)
        k_nope, v = kv.split([self.nope, self.v], dim=-1)
        k = torch.cat([k_nope, k_rope[:, None].expand(B, h, S, self.rope)], dim=-1)  # (B, h, S, qk)
        scores = q @ k.transpose(-1, -2) * self.softmax_scale  # (B, h, T, S)
        past = S - T  # query i sits at position past + i and sees keys 0 .. past + i
        causal = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(past)
        attn = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v  # (B, h, T, v)
        return self.o_proj(attn.transpose(1, 2).reshape(B, T, h * self.v))  # TP: row-parallel, then g


def cache_bytes_per_token(config, t, itemsize, kind):
    """Bytes one token adds to one layer's cache on each rank.

    "mla": the latent, kv_lora + rope, on every rank whatever t; "mha": K and V of its nh/t
    heads of (nope + rope) and v numbers; "gqa": the same with n_kv heads instead of nh
    (a rank holds max(n_kv/t, 1) of them: a KV head cannot be split).
    """
    if kind == "mla":
        return (config.kv_lora_rank + config.qk_rope_head_dim) * itemsize
    heads = config.num_attention_heads if kind == "mha" else config.num_key_value_heads
    per_rank = max(heads // t, 1)
    return per_rank * (config.qk_nope_head_dim + config.qk_rope_head_dim + config.v_head_dim) * itemsize
