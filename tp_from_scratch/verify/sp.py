"""The sequence-parallel checks: the mappings along T, LayerNorm's gradient rule, an SP block.

Activations are (B, T, H); a rank holds the positions [lo, hi) = layout(T, rank, t) of T
(T = 12 splits evenly at t = 2, 3, 4). Every rank draws the same full data from one seed, or
its own where the mapping sums over ranks, so the references need no communication:

    sp gather    (B, T_r, H) -> (B, T, H): Y = concat_r x_r along T; dX = (sum_r dY_r)[:, lo:hi]
    sp scatter   (B, T, H) partial -> (B, T_r, H): Y = (sum_r x_r)[:, lo:hi]; dX = concat_r dY_r
    sp layernorm LayerNorm on this rank's positions; its weight and bias gradients must be the
                 whole sequence's (each rank's covers only its positions: they are all-reduced)
    sp block     Block below, run sequence-parallel: x shard in, y shard out; fc1 column-
                 parallel, fc2 row-parallel (weight blocks as for the layers), LayerNorm and
                 fc2's bias replicated with the whole sequence's gradients
"""
import copy

import torch
from torch import nn
from torch.distributed.tensor import Replicate
from torch.nn import functional as F

from tp_from_scratch.nn import checks
from tp_from_scratch.nn.mappings import tp_rank, tp_world_size
from tp_from_scratch.testing import random_array, rank_rng

B, T, H, FFN = 2, 12, 8, 12


class Block(nn.Module):
    """The single-device pre-LN MLP block an sp_block factory receives: x + fc2(gelu(fc1(ln(x))))."""

    def __init__(self, hidden=H, ffn=FFN, dtype=None):
        super().__init__()
        self.ln = nn.LayerNorm(hidden, dtype=dtype)
        self.fc1 = nn.Linear(hidden, ffn, dtype=dtype)
        self.fc2 = nn.Linear(ffn, hidden, dtype=dtype)

    def forward(self, x):                        # (B, T, H) -> (B, T, H)
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


def _tensor(a, dtype, device, grad=False):
    return torch.tensor(a, dtype=dtype, device=device, requires_grad=grad)


def _grad(p):
    """p's gradient as this rank holds it; a DTensor gradient placed Partial (a sum still
    owed, DTensor's way to defer SP's all-reduce until the optimizer reads it) is summed first."""
    g = p.grad
    if hasattr(g, "placements") and any(place.is_partial() for place in g.placements):
        g = g.redistribute(g.device_mesh, [Replicate()] * len(g.placements))
    return g


def check_sp_mapping(group, dtype, seed, *, kind, fn, layout, judge, device="cpu"):
    """sp gather or sp scatter against its definition along T (see the module docstring)."""
    rank, t = tp_rank(group), tp_world_size(group)
    blocks = [slice(*layout(T, r, t)) for r in range(t)]
    mine = blocks[rank]
    drawn = [rank_rng(seed, r) for r in range(t)]
    if kind == "sp gather":
        xs = [random_array(rng, (B, T, H))[:, blocks[r]] for r, rng in enumerate(drawn)]
        dys = [random_array(rng, (B, T, H)) for rng in drawn]
        x, dy = xs[rank], dys[rank]
        y_ref, dx_ref = torch.cat([torch.as_tensor(a) for a in xs], 1), sum(dys)[:, mine]
    else:
        xs = [random_array(rng, (B, T, H)) for rng in drawn]
        dys = [random_array(rng, (B, T, H))[:, blocks[r]] for r, rng in enumerate(drawn)]
        x, dy = xs[rank], dys[rank]
        y_ref, dx_ref = sum(xs)[:, mine], torch.cat([torch.as_tensor(a) for a in dys], 1)
    x_tp, dy_tp = _tensor(x, dtype, device, True), _tensor(dy, dtype, device)
    with judge.phase("forward"):
        y = fn(group, x_tp)
    with judge.phase("backward"):
        y.backward(dy_tp)
    judge.match(y, torch.as_tensor(y_ref).to(dtype), name="Y", rank=rank)
    judge.match(x_tp.grad, torch.as_tensor(dx_ref).to(dtype), name="dX", rank=rank)
    checks.check_untouched_and_fresh(judge, rank, y, X=(x_tp, _tensor(x, dtype, device)),
                                     dY=(dy_tp, _tensor(dy, dtype, device)))


def _reference(module, x, dy, dtype, device):
    x_ref = _tensor(x, dtype, device, True)
    y_ref = module(x_ref)
    y_ref.backward(_tensor(dy, dtype, device))
    return x_ref, y_ref


def check_sp_layernorm(group, dtype, seed, *, make, layout, judge, device="cpu"):
    """LayerNorm on this rank's positions: Y and dX shards, and the whole sequence's dW, db."""
    rank, t = tp_rank(group), tp_world_size(group)
    rng = rank_rng(seed, 0)
    norm = nn.LayerNorm(H, dtype=dtype, device=device)
    with torch.no_grad():
        norm.weight.copy_(_tensor(1 + 0.1 * random_array(rng, (H,)), dtype, device))
        norm.bias.copy_(_tensor(random_array(rng, (H,)), dtype, device))
    x, dy = random_array(rng, (B, T, H)), random_array(rng, (B, T, H))
    mine = slice(*layout(T, rank, t))
    layer = make(group, copy.deepcopy(norm))
    x_ref, y_ref = _reference(norm, x, dy, dtype, device)
    x_tp = _tensor(x[:, mine], dtype, device, True)
    with judge.phase("forward"):
        y = layer(x_tp)
    with judge.phase("backward"):
        y.backward(_tensor(dy[:, mine], dtype, device))
    judge.match(y, y_ref[:, mine], name="Y", rank=rank)
    judge.match(x_tp.grad, x_ref.grad[:, mine], name="dX", rank=rank)
    judge.match(_grad(layer.weight), norm.weight.grad, name="dW (the whole sequence's)", rank=rank)
    judge.match(_grad(layer.bias), norm.bias.grad, name="db (the whole sequence's)", rank=rank)


def check_sp_block(group, dtype, seed, *, make, layout, judge, device="cpu"):
    """Block run sequence-parallel: Y and dX shards, every parameter's gradient (its block)."""
    rank, t = tp_rank(group), tp_world_size(group)
    rng = rank_rng(seed, 0)
    block = Block(dtype=dtype).to(device)
    with torch.no_grad():  # drawn from the seed, not torch's RNG (which simulated ranks share)
        for p in block.parameters():
            p.copy_(_tensor(random_array(rng, tuple(p.shape)), dtype, device))
    x, dy = random_array(rng, (B, T, H)), random_array(rng, (B, T, H))
    mine, (lo, hi) = slice(*layout(T, rank, t)), layout(FFN, rank, t)
    layer = make(group, copy.deepcopy(block))
    x_ref, y_ref = _reference(block, x, dy, dtype, device)
    x_tp = _tensor(x[:, mine], dtype, device, True)
    with judge.phase("forward"):
        y = layer(x_tp)
    with judge.phase("backward"):
        y.backward(_tensor(dy[:, mine], dtype, device))
    judge.match(y, y_ref[:, mine], name="Y", rank=rank)
    judge.match(x_tp.grad, x_ref.grad[:, mine], name="dX", rank=rank)
    expected = {"ln.weight": block.ln.weight.grad, "ln.bias": block.ln.bias.grad,
                "fc1.weight": block.fc1.weight.grad[lo:hi], "fc1.bias": block.fc1.bias.grad[lo:hi],
                "fc2.weight": block.fc2.weight.grad[:, lo:hi], "fc2.bias": block.fc2.bias.grad}
    for name, want in expected.items():
        module, field = name.split(".")
        got = getattr(getattr(layer, module), field)
        kind = "dW" if field == "weight" else "db"
        judge.match(_grad(got), want, name=f"{kind} {name}", rank=rank)


def cases(Case):
    """The SP cases of the suite (suite.all_cases appends them)."""
    def mapping(kind, field):
        def run(r):
            check_sp_mapping(r.group, r.dtype, r.seed, kind=kind, fn=getattr(r.adapter, field),
                             layout=r.adapter.layout, judge=r.judge, device=r.device)
        return Case(kind, None, run, field)

    def layer(kind, field, check_fn):
        def run(r):
            check_fn(r.group, r.dtype, r.seed, make=getattr(r.adapter, field), layout=r.adapter.layout,
                     judge=r.judge, device=r.device)
        return Case(kind, None, run, field)
    return [mapping("sp gather", "sp_gather"), mapping("sp scatter", "sp_scatter"),
            layer("sp layernorm", "sp_layernorm", check_sp_layernorm),
            layer("sp block", "sp_block", check_sp_block)]
