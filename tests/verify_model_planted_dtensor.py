"""Test-only: the seven planted TP bugs again, in a model given to DTensor's parallelize_module
(examples/dtensor_model.py), each an entry point of `verify model`:

    .venv/bin/python -m tp_from_scratch.verify model --entry tests/verify_model_planted_dtensor.py:o_proj_colwise --t 2

``PLANTED[function name] = (the module its 'first divergence:' line must name, what the line
must say it looks like)``.
"""
import copy
import sys
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from dtensor_clip import clip_grad_norm, replicate_the_rest  # noqa: E402
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


def q_heads_in_the_wrong_order(mesh, dtype):
    """Layer 0's query heads dealt to the ranks in reverse (rank r holds rank t-1-r's Shard(0)
    block of q), keys and values in order."""
    def alter(out, mesh):
        t, rank = mesh.size(), mesh.get_local_rank()
        q, full = out["parallel"].layers[0].attn.q, out["reference"].layers[0].attn.q.weight.detach()
        q.weight = nn.Parameter(DTensor.from_local(full.chunk(t, dim=0)[t - 1 - rank].clone(), mesh, [Shard(0)]))
    return _pair(mesh, dtype, alter=alter)


def clip_grad_norm_paths(mesh, dtype):
    """Not a bug: docs/verify.md's claims about clip_grad_norm_ on this model, checked against the
    single-device clip (a failed claim raises, and `verify model` reports it refused at load);
    then the model with every parameter a DTensor (examples/dtensor_clip.py:replicate_the_rest),
    which must equal one device like the example."""
    import torch.nn.functional as F
    from torch.distributed.tensor.parallel import loss_parallel

    def stepped(all_dtensor):
        out = _pair(mesh, dtype)
        if all_dtensor:
            replicate_the_rest(out["parallel"], mesh)
        ids, targets = (torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(s)) for s in (1, 2))
        F.cross_entropy(out["reference"](ids).flatten(0, 1), targets.flatten()).backward()
        with loss_parallel():
            F.cross_entropy(out["parallel"](ids).flatten(0, 1), targets.flatten()).backward()
        return out["reference"], out["parallel"]

    def same_as_one_device(reference, parallel, total):
        want = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        got = total.full_tensor() if isinstance(total, DTensor) else total
        mine = dict(parallel.named_parameters())
        full = lambda g: g.full_tensor() if isinstance(g, DTensor) else g  # noqa: E731
        worst = max(float((full(mine[n].grad) - p.grad).abs().max()) for n, p in reference.named_parameters())
        assert abs(float(got) - float(want)) < 1e-12 * float(want) and worst < 1e-12, (float(got), float(want), worst)

    for foreach in (None, False):      # the plan's mix of plain tensors and DTensors: it raises
        reference, parallel = stepped(False)
        try:
            torch.nn.utils.clip_grad_norm_(parallel.parameters(), 0.5, foreach=foreach)
        except RuntimeError as error:
            assert "got mixed torch.Tensor and DTensor" in str(error), error
        else:
            raise AssertionError(f"clip_grad_norm_(foreach={foreach}) no longer raises on a mixed model")
    reference, parallel = stepped(False)
    same_as_one_device(reference, parallel, clip_grad_norm(list(parallel.parameters()), 0.5))
    for foreach in (None, False):      # every parameter a DTensor: torch's own clip works
        reference, parallel = stepped(True)
        same_as_one_device(reference, parallel, torch.nn.utils.clip_grad_norm_(
            parallel.parameters(), 0.5, foreach=foreach))
    out = _pair(mesh, dtype)
    replicate_the_rest(out["parallel"], mesh)
    return out


# entry function -> (the module the first divergence must name, what its line must say)
PLANTED = {
    "o_proj_colwise": ("layers.0.attn.o", "Shard where Replicate was expected"),
    "missing_f_in_layer_1": ("layers.1.attn", "Partial where Replicate was expected"),
    "extra_all_reduce": ("layers.0.mlp.down", "x t"),
    "kv_heads_split": ("layers.0.attn.k", "a head cut across ranks"),
    "rope_offset_on_rank_1": ("layers.0.attn", "wrong on rank 1 only"),
    "cross_entropy_without_the_max": ("(loss)", "values differ"),
    "q_heads_in_the_wrong_order": ("layers.0.attn.q", "rows permuted"),
}
