"""Test-only: the six planted TP bugs again, in a model given to DTensor's parallelize_module
(examples/dtensor_model.py), each an entry point of `verify model`:

    .venv/bin/python -m tp_from_scratch.verify model --entry tests/verify_model_planted_dtensor.py:o_proj_colwise --t 2

``PLANTED[function name] = the module its 'first divergence:' line must name``.
"""
import copy
import sys
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from dtensor_model import TinyLM, plan, rope  # noqa: E402

from tp_from_scratch.nn import reduce_from_tp_region  # noqa: E402


def _pair(mesh, dtype, rules=None, alter=None, **sizes):
    torch.manual_seed(0)
    reference = TinyLM(**sizes).to(dtype)
    parallel = parallelize_module(copy.deepcopy(reference), mesh, rules or plan(len(reference.layers)))
    out = dict(reference=reference, parallel=parallel, layers=len(reference.layers),
               vocab_size=reference.embed.num_embeddings)
    if alter:
        alter(out, mesh)
    return out


def o_proj_colwise(mesh, dtype):
    rules = plan()
    rules["layers.0.attn.o"] = ColwiseParallel()
    return _pair(mesh, dtype, rules)


class LocalColumn(nn.Module):
    """A hand-written column layer without f: the local matmul on its Shard(0) weight, so its
    input's gradient stays this rank's partial sum."""

    def __init__(self, linear, mesh):
        super().__init__()
        self.weight = nn.Parameter(distribute_tensor(linear.weight.detach().clone(), mesh, [Shard(0)]))

    def forward(self, x):
        return nn.functional.linear(x, self.weight.to_local())


def missing_f_in_layer_1(mesh, dtype):
    def alter(out, mesh):
        attn, single = out["parallel"].layers[1].attn, out["reference"].layers[1].attn
        for name in ("q", "k", "v"):
            setattr(attn, name, LocalColumn(getattr(single, name), mesh))
    rules = {k: v for k, v in plan().items() if not k.startswith("layers.1.attn.") or k.endswith(".o")}
    return _pair(mesh, dtype, rules, alter)


def extra_all_reduce(mesh, dtype):
    def alter(out, mesh):
        out["parallel"].layers[0].mlp.down.register_forward_hook(
            lambda module, args, y: reduce_from_tp_region(mesh.get_group(), y))
    return _pair(mesh, dtype, alter=alter)


def kv_heads_split(mesh, dtype):
    return _pair(mesh, dtype, kv_heads=1)


def rope_offset_on_rank_1(mesh, dtype):
    def forward(attn, x):                  # the example's Attention.forward, queries one position on
        B, T, _ = x.shape
        q, k, v = (p(x).view(B, T, -1, attn.head_dim).transpose(1, 2) for p in (attn.q, attn.k, attn.v))
        positions = torch.arange(T)
        q, k = rope(q, positions + 1), rope(k, positions)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return attn.o(y.transpose(1, 2).reshape(B, T, -1))

    def alter(out, mesh):
        if mesh.get_local_rank() == 1:
            attn = out["parallel"].layers[0].attn
            attn.forward = lambda x: forward(attn, x)
    return _pair(mesh, dtype, alter=alter)


def cross_entropy_without_the_max(mesh, dtype):
    """A hand-written vocab-parallel cross-entropy on the Shard(-1) logits, each rank shifting
    by its own max (the max's all-reduce left out)."""
    group = mesh.get_group()

    def loss(logits, targets):
        z = logits.to_local() if isinstance(logits, DTensor) else logits           # (B, T, V/t)
        start = mesh.get_local_rank() * z.shape[-1]
        shifted = z - z.max(-1, keepdim=True).values.detach()
        local = targets - start
        outside = (local < 0) | (local >= z.shape[-1])
        picked = shifted.gather(-1, local.masked_fill(outside, 0).unsqueeze(-1)).squeeze(-1)
        target_logit = reduce_from_tp_region(group, picked.masked_fill(outside, 0.0))
        return (reduce_from_tp_region(group, shifted.exp().sum(-1)).log() - target_logit).mean()

    out = _pair(mesh, dtype)
    out["loss"] = loss
    return out


# entry function -> the module the first divergence must name
PLANTED = {
    "o_proj_colwise": "layers.0.attn.o",
    "missing_f_in_layer_1": "layers.1.attn",
    "extra_all_reduce": "layers.0.mlp.down",
    "kv_heads_split": "layers.0.attn.k",
    "rope_offset_on_rank_1": "layers.0.attn",
    "cross_entropy_without_the_max": "(loss)",
}
