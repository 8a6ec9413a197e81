"""A tiny Llama-shaped language model and its DTensor plan: an entry point for `verify model`.

    .venv/bin/python -m tp_from_scratch.verify model --entry examples/dtensor_model.py:tiny_lm
"""
import copy

import torch
from torch import nn
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def rope(x, positions, theta=1000.0):
    """Turn each head of x (B, n, T, hs) by its position (the rotate-half form)."""
    half = x.shape[-1] // 2
    freq = theta ** (-torch.arange(half, dtype=torch.float64) / half)
    angle = positions.to(torch.float64)[:, None] * freq                  # (T, hs/2)
    cos, sin = torch.cat([angle.cos()] * 2, -1).to(x.dtype), torch.cat([angle.sin()] * 2, -1).to(x.dtype)
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class Attention(nn.Module):
    def __init__(self, hidden, heads, kv_heads):
        super().__init__()
        self.head_dim = hidden // heads
        self.q = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(heads * self.head_dim, hidden, bias=False)

    def forward(self, x):                                              # (B, T, H)
        B, T, _ = x.shape
        # the head counts are read off the shapes: a rank holding nh/t heads runs them alone
        q, k, v = (p(x).view(B, T, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        positions = torch.arange(T)
        q, k = rope(q, positions), rope(k, positions)
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)   # (B, n, T, hs)
        return self.o(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.gate, self.up = nn.Linear(hidden, ffn, bias=False), nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, hidden, heads, kv_heads, ffn):
        super().__init__()
        self.norm1, self.attn = nn.RMSNorm(hidden), Attention(hidden, heads, kv_heads)
        self.norm2, self.mlp = nn.RMSNorm(hidden), MLP(hidden, ffn)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab=96, hidden=48, heads=12, kv_heads=12, ffn=96, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(Block(hidden, heads, kv_heads, ffn) for _ in range(layers))
        self.norm, self.lm_head = nn.RMSNorm(hidden), nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids):                                            # (B, T) -> (B, T, V)
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def plan(layers=2):
    """Megatron's split: q, k, v, gate, up colwise; o, down rowwise; the LM head colwise with its
    logits left Shard(-1) (verify computes the loss under loss_parallel); the rest replicated."""
    rules = {"lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    for i in range(layers):
        rules.update({f"layers.{i}.attn.{n}": ColwiseParallel() for n in ("q", "k", "v")})
        rules.update({f"layers.{i}.mlp.{n}": ColwiseParallel() for n in ("gate", "up")})
        rules.update({f"layers.{i}.attn.o": RowwiseParallel(), f"layers.{i}.mlp.down": RowwiseParallel()})
    return rules


def tiny_lm(mesh, dtype, **sizes):
    """verify model's entry point: the single-device model and its TP twin, the same weights."""
    torch.manual_seed(0)
    reference = TinyLM(**sizes).to(dtype)
    parallel = parallelize_module(copy.deepcopy(reference), mesh, plan(len(reference.layers)))
    return dict(reference=reference, parallel=parallel, layers=len(reference.layers),
                vocab_size=reference.embed.num_embeddings)
