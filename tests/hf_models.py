"""Test-only: tiny Hugging Face GPT-2 and Llama models with random weights (no hub access).

transformers computes three things of Llama in float32 even when the model is float64:
RMSNorm (``hidden_states.to(torch.float32)``), the RoPE cos/sin tables (``inv_freq`` is a
float32 buffer and ``forward`` calls ``.float()``), and the eager attention's softmax
(``dtype=torch.float32``). ``float64_llama`` replaces the first two with the same formulas
in the model's dtype and the model uses the "sdpa" attention, which computes in the input's
dtype; so float64 comparisons can be held to float64's tolerance. GPT-2's eager attention
has no such cast. The unpatched models are compared in float32 too.
"""
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM


def randomize(model, seed):
    """Every parameter drawn at random (transformers' init zeroes biases and sets norms to 1,
    which would hide a misplaced bias or norm weight)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            p.copy_(1 + 0.1 * noise if ("ln" in name or "norm" in name) and name.endswith("weight")
                    else 0.2 * noise)
    return model


def gpt2(seed=0, dtype=torch.float64, **sizes):
    kw = dict(vocab_size=67, n_positions=16, n_embd=32, n_layer=2, n_head=4, activation_function="gelu_new",
              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
              attn_implementation="eager")
    kw.update(sizes)
    return randomize(GPT2LMHeadModel(GPT2Config(**kw)), seed).to(dtype).eval()


def llama(seed=0, dtype=torch.float64, patch=True, **sizes):
    kw = dict(vocab_size=67, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=8,
              num_key_value_heads=2, max_position_embeddings=16, rms_norm_eps=1e-6, rope_theta=1000.0,
              tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=None,
              attn_implementation="sdpa")
    kw.update(sizes)
    model = randomize(LlamaForCausalLM(LlamaConfig(**kw)), seed).to(dtype).eval()
    return float64_llama(model) if patch else model


def float64_llama(model):
    """Make the float32 islands of transformers' Llama compute in the model's dtype."""
    for module in model.modules():
        if type(module).__name__ == "LlamaRMSNorm":
            module.forward = _rms_forward(module)
        if type(module).__name__ == "LlamaRotaryEmbedding":
            module.forward = _rope_forward(model.config)
    return model


def _rms_forward(m):
    def forward(h):
        return m.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + m.variance_epsilon))
    return forward


def _rope_forward(config, dim=None):
    dim = dim or config.hidden_size // config.num_attention_heads
    theta = config.rope_parameters["rope_theta"]

    def forward(x, position_ids):
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    return forward


def _rope_from_buffer(m):
    """cos/sin in the model's dtype from transformers' own frequencies (its inv_freq buffer,
    computed in float32 by its rope function: YaRN's has no float64 formula to restate here)
    and its attention_scaling; the test gives the course's model the same frequencies."""
    def forward(x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * m.inv_freq.to(torch.float64)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * m.attention_scaling).to(x.dtype), (emb.sin() * m.attention_scaling).to(x.dtype)
    return forward


# ---- DeepSeek-V3 ---------------------------------------------------------------------------
# Beyond Llama's two islands, transformers' DeepseekV3 computes its router in float32
# (``F.linear(h.type(torch.float32), weight.type(torch.float32))``, so the routing weights carry
# float32's precision) and its grouped-matmul experts refuse float64 (hence
# ``_experts_implementation = "eager"``). ``float64_deepseek`` restates the router's forward in
# the model's dtype; tests/test_deepseek_moe.py checks that restatement against transformers'
# own router in float32 (same experts, weights within float32's tolerance).

def deepseek_v3_config(**sizes):
    from transformers import DeepseekV3Config
    kw = dict(vocab_size=67, hidden_size=32, intermediate_size=48, moe_intermediate_size=12,
              num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4,
              q_lora_rank=16, kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
              n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2, n_shared_experts=2,
              routed_scaling_factor=2.5, norm_topk_prob=True, max_position_embeddings=32,
              rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
              tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=None,
              attn_implementation="sdpa")
    kw.update(sizes)
    config = DeepseekV3Config(**kw)
    config._experts_implementation = "eager"
    return config


def randomize_router_bias(model, seed):
    """The selection bias at random too (transformers starts it at zero, which would hide
    a bias wrongly added to the weights)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.3 * torch.randn(buffer.shape, generator=g, dtype=torch.float64))
    return model


def deepseek_moe(seed=0, dtype=torch.float64, patch=True, **sizes):
    """A transformers DeepseekV3MoE layer with random weights and selection bias."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
    layer = randomize_router_bias(randomize(DeepseekV3MoE(deepseek_v3_config(**sizes)), seed), seed + 1)
    layer = layer.to(dtype).eval()
    if patch:
        layer.gate.forward = _router_forward(layer.gate)
    return layer


def float64_deepseek(model):
    """Make the float32 islands of transformers' DeepseekV3 compute in the model's dtype."""
    for module in model.modules():
        name = type(module).__name__
        if name == "DeepseekV3RMSNorm":
            module.forward = _rms_forward(module)
        if name == "DeepseekV3RotaryEmbedding" and model.config.rope_parameters.get("rope_type") == "yarn":
            module.forward = _rope_from_buffer(module)
        elif name == "DeepseekV3RotaryEmbedding":
            module.forward = _rope_forward(model.config, model.config.qk_rope_head_dim)
        if name == "DeepseekV3TopkRouter":
            module.forward = _router_forward(module)
    return model


def deepseek_v3(seed=0, dtype=torch.float64, patch=True, **sizes):
    """A tiny transformers DeepseekV3ForCausalLM with random weights and selection biases."""
    from transformers import DeepseekV3ForCausalLM
    model = randomize_router_bias(randomize(DeepseekV3ForCausalLM(deepseek_v3_config(**sizes)), seed), seed + 1)
    model = model.to(dtype).eval()
    return float64_deepseek(model) if patch else model


def _router_forward(m):
    """transformers' DeepseekV3TopkRouter.forward without its cast to float32."""
    def forward(h):
        h = h.view(-1, m.hidden_dim)
        logits = h @ m.weight.T
        scores = logits.sigmoid()
        choice = scores + m.e_score_correction_bias
        per_group = m.num_experts // m.num_group
        group_scores = choice.view(-1, m.num_group, per_group).topk(2, dim=-1)[0].sum(dim=-1)
        groups = torch.topk(group_scores, k=m.topk_group, dim=-1, sorted=False)[1]
        mask = torch.zeros_like(group_scores).scatter_(1, groups, 1)
        mask = mask.unsqueeze(-1).expand(-1, m.num_group, per_group).reshape(-1, m.num_experts)
        choice = choice.masked_fill(~mask.bool(), float("-inf"))
        indices = torch.topk(choice, k=m.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, indices)
        if m.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return logits, weights * m.routed_scaling_factor, indices
    return forward
