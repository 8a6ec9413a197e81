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


def _rope_forward(config):
    dim = config.hidden_size // config.num_attention_heads
    theta = config.rope_parameters["rope_theta"]

    def forward(x, position_ids):
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    return forward
