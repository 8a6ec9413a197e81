"""The sequence-parallel checks: the mappings along T, LayerNorm's gradient rule, an SP block.

Activations are (B, T, ..., H): dim 1 is the sequence; a rank holds the positions
[lo, hi) = layout(T, rank, t) of T (T = 12 splits evenly at t = 2, 3, 4; 13 unevenly). Every
rank draws the same full data from one seed, or its own where the mapping sums over ranks,
so the references need no communication:

    sp gather    (B, T_r, ...) -> (B, T, ...): Y = concat_r x_r along T; dX = (sum_r dY_r)[:, lo:hi]
    sp scatter   (B, T, ...) partial -> (B, T_r, ...): Y = (sum_r x_r)[:, lo:hi]; dX = concat_r dY_r
    sp layernorm LayerNorm on this rank's positions; its weight and bias gradients must be the
                 whole sequence's (each rank's covers only its positions: they are all-reduced)
    sp block     Block below, run sequence-parallel: x shard in, y shard out; fc1 column-
                 parallel, fc2 row-parallel (weight blocks as for the layers), LayerNorm and
                 fc2's bias replicated with the whole sequence's gradients; in the token-order
                 check the block's mix is a causal mean over T, so the order of the gathered
                 positions shows (contract 3: the adapter's block calls block.mix)

The input variants are the suite's (suite.all_cases hands them in): 2-D (B, T) for the
mappings, 4-D (B, T, 2, H), a non-contiguous input, two passes whose parameter gradients must
accumulate (the layers), an uneven T (13; needs "uneven"), random shapes from the seed. On an
uneven T, a mapping or module whose call has a ``sizes`` parameter gets every rank's T_r.
"""
import copy
import inspect

import torch
from torch import nn
from torch.distributed.tensor import Replicate
from torch.nn import functional as F

from tp_from_scratch.nn import check as checks
from tp_from_scratch.nn.mappings import tp_rank, tp_world_size
from tp_from_scratch.testing import random_array, rank_rng

B, T, H, FFN = 2, 12, 8, 12
SHAPE = (B, T, H)


class CausalMean(nn.Module):
    """h_i -> (h_0 + ... + h_i) / (i + 1) along T (dim 1), feature by feature: token mixing that
    depends on the order of the positions, and acts on any slice of the features (FFN/t)."""

    def forward(self, h):                        # (B, T, ..., F) -> the same
        count = torch.arange(1, h.shape[1] + 1, dtype=h.dtype, device=h.device)
        return h.cumsum(1) / count.view(1, -1, *[1] * (h.dim() - 2))


class Block(nn.Module):
    """The single-device pre-LN MLP block an sp_block factory receives:
    x + fc2(mix(gelu(fc1(ln(x))))), ``mix`` the identity except in the token-order check, where it
    is a CausalMean over the whole sequence (contract 3: an adapter's block calls block.mix)."""

    def __init__(self, hidden=H, ffn=FFN, dtype=None, mix=False):
        super().__init__()
        self.ln = nn.LayerNorm(hidden, dtype=dtype)
        self.fc1 = nn.Linear(hidden, ffn, dtype=dtype)
        self.fc2 = nn.Linear(ffn, hidden, dtype=dtype)
        self.mix = CausalMean() if mix else nn.Identity()

    def forward(self, x):                        # (B, T, ..., H) -> (B, T, ..., H)
        return x + self.fc2(self.mix(F.gelu(self.fc1(self.ln(x)))))


def _tensor(a, dtype, device, grad=False):
    return torch.tensor(a, dtype=dtype, device=device, requires_grad=grad)


def _grad(p):
    """p's gradient as this rank holds it; a DTensor gradient placed Partial (a sum still
    owed, DTensor's way to defer SP's all-reduce until the optimizer reads it) is summed first."""
    g = p.grad
    if hasattr(g, "placements") and any(place.is_partial() for place in g.placements):
        g = g.redistribute(g.device_mesh, [Replicate()] * len(g.placements))
    return g


def _sizes(fn, blocks, t):
    """{"sizes": every rank's T_r} when T is uneven and fn takes a ``sizes`` parameter, else {}."""
    lengths = [b.stop - b.start for b in blocks]
    if len(set(lengths)) == 1 or "sizes" not in inspect.signature(fn).parameters:
        return {}
    return {"sizes": lengths}


def check_sp_mapping(group, dtype, seed, *, kind, fn, layout, judge, device="cpu", shape=SHAPE,
                     feed=None):
    """sp gather or sp scatter against its definition along T (see the module docstring).
    shape: the full (B, T, ...) input; feed: applied to the input on its way in (non-contiguous)."""
    rank, t = tp_rank(group), tp_world_size(group)
    blocks = [slice(*layout(shape[1], r, t)) for r in range(t)]
    mine = blocks[rank]
    drawn = [rank_rng(seed, r) for r in range(t)]
    if kind == "sp gather":
        xs = [random_array(rng, shape)[:, blocks[r]] for r, rng in enumerate(drawn)]
        dys = [random_array(rng, shape) for rng in drawn]
        x, dy = xs[rank], dys[rank]
        y_ref, dx_ref = torch.cat([torch.as_tensor(a) for a in xs], 1), sum(dys)[:, mine]
    else:
        xs = [random_array(rng, shape) for rng in drawn]
        dys = [random_array(rng, shape)[:, blocks[r]] for r, rng in enumerate(drawn)]
        x, dy = xs[rank], dys[rank]
        y_ref, dx_ref = sum(xs)[:, mine], torch.cat([torch.as_tensor(a) for a in dys], 1)
    x_tp, dy_tp = _tensor(x, dtype, device, True), _tensor(dy, dtype, device)
    sizes = _sizes(fn, blocks, t) if kind == "sp gather" else {}
    with judge.phase("forward"):
        y = fn(group, feed(x_tp) if feed else x_tp, **sizes)
    with judge.phase("backward"):
        y.backward(dy_tp)
    judge.match(y, torch.as_tensor(y_ref).to(dtype), name="Y", rank=rank)
    judge.match(x_tp.grad, torch.as_tensor(dx_ref).to(dtype), name="dX", rank=rank)
    checks.check_untouched_and_fresh(judge, rank, y, X=(x_tp, _tensor(x, dtype, device)),
                                     dY=(dy_tp, _tensor(dy, dtype, device)))


def _run_both(reference, layer, x, dys, mine, blocks, dtype, device, judge, feed):
    """Forward and backward the reference on the whole x and the layer on this rank's
    positions, once per dY (parameter gradients accumulate): (x_ref, y_ref, x_tp, y_tp)."""
    x_ref, x_tp = _tensor(x, dtype, device, True), _tensor(x[:, mine], dtype, device, True)
    sizes = _sizes(layer.forward, blocks, len(blocks))
    for dy in dys:
        y_ref = reference(x_ref)
        y_ref.backward(_tensor(dy, dtype, device))
        with judge.phase("forward"):
            y = layer(feed(x_tp) if feed else x_tp, **sizes)
        with judge.phase("backward"):
            y.backward(_tensor(dy[:, mine], dtype, device))
    return x_ref, y_ref, x_tp, y


def _draws(rng, shape, passes):
    x = random_array(rng, shape)
    return x, [random_array(rng, shape) for _ in range(passes)]


def check_sp_layernorm(group, dtype, seed, *, make, layout, judge, device="cpu", shape=SHAPE,
                       feed=None, passes=1):
    """LayerNorm on this rank's positions: Y and dX shards, and the whole sequence's dW, db
    (summed over the passes)."""
    rank, t = tp_rank(group), tp_world_size(group)
    rng = rank_rng(seed, 0)
    hidden = shape[-1]
    norm = nn.LayerNorm(hidden, dtype=dtype, device=device)
    with torch.no_grad():
        norm.weight.copy_(_tensor(1 + 0.1 * random_array(rng, (hidden,)), dtype, device))
        norm.bias.copy_(_tensor(random_array(rng, (hidden,)), dtype, device))
    x, dys = _draws(rng, shape, passes)
    blocks = [slice(*layout(shape[1], r, t)) for r in range(t)]
    mine = blocks[rank]
    layer = make(group, copy.deepcopy(norm))
    x_ref, y_ref, x_tp, y = _run_both(norm, layer, x, dys, mine, blocks, dtype, device, judge, feed)
    judge.match(y, y_ref[:, mine], name="Y", rank=rank)
    judge.match(x_tp.grad, x_ref.grad[:, mine], name="dX", rank=rank)
    judge.match(_grad(layer.weight), norm.weight.grad, name="dW (the whole sequence's)", rank=rank)
    judge.match(_grad(layer.bias), norm.bias.grad, name="db (the whole sequence's)", rank=rank)


def check_sp_block(group, dtype, seed, *, make, layout, judge, device="cpu", shape=SHAPE,
                   feed=None, passes=1, mix=False):
    """Block run sequence-parallel: Y and dX shards, every parameter's gradient (its block).
    mix: the block's mix is a CausalMean, so the order of the gathered positions shows (the
    token-order check: a gather that puts the ranks' positions in another order, undone by the
    reduce-scatter, is invisible to a block that treats each position alone)."""
    rank, t = tp_rank(group), tp_world_size(group)
    rng = rank_rng(seed, 0)
    block = Block(hidden=shape[-1], dtype=dtype, mix=mix).to(device)
    with torch.no_grad():  # drawn from the seed, not torch's RNG (which simulated ranks share)
        for p in block.parameters():
            p.copy_(_tensor(random_array(rng, tuple(p.shape)), dtype, device))
    x, dys = _draws(rng, shape, passes)
    blocks = [slice(*layout(shape[1], r, t)) for r in range(t)]
    mine, (lo, hi) = blocks[rank], layout(FFN, rank, t)
    layer = make(group, copy.deepcopy(block))
    x_ref, y_ref, x_tp, y = _run_both(block, layer, x, dys, mine, blocks, dtype, device, judge, feed)
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


def cases(Case, *, t, seed, supports, non_contiguous, random_sizes, uneven):
    """The SP cases of the suite, a list per component, each component on the suite's input
    variants (suite.all_cases appends them and hands in its non_contiguous, random_sizes and
    uneven size)."""
    groups = []
    for component, field, check_fn in (("sp gather", "sp_gather", check_sp_mapping),
                                       ("sp scatter", "sp_scatter", check_sp_mapping),
                                       ("sp layernorm", "sp_layernorm", check_sp_layernorm),
                                       ("sp block", "sp_block", check_sp_block)):
        mapping = check_fn is check_sp_mapping
        out = []
        groups.append(out)

        def add(check, needs=(), inputs="", component=component, field=field, check_fn=check_fn,
                mapping=mapping, since=None, contract=1, note="", **options):
            def run(r):
                given = getattr(r.adapter, field)
                check_fn(r.group, r.dtype, r.seed, layout=r.adapter.layout, judge=r.judge,
                         device=r.device, **(dict(kind=component, fn=given) if mapping else
                                             dict(make=given)), **options)
            out.append(Case(component, check, run, field, needs=needs, inputs=inputs, since=since,
                            contract=contract, note=note))

        add(None)
        if mapping:                      # a LayerNorm over H needs H: no (B, T) input
            add("2-D input", shape=(B, T))
        add("4-D input", shape=(B, T, 2, H))
        add("non-contiguous input", feed=non_contiguous)
        if not mapping:                  # a mapping has no parameter to accumulate into
            add("two passes (accumulate)", passes=2)
        add(f"uneven T ({uneven})", needs=("uneven",), shape=(B, uneven, H))
        batch, length, hidden = random_sizes(seed, component, t, "uneven" in supports)
        shape = (batch[0], length, *batch[1:], hidden)
        add("random shapes", shape=shape, inputs=f"x {shape}, seed {seed}")
        if component == "sp block":
            add("token order", mix=True, since=3, contract=3,
                note="the block's mix, a causal mean over T, is block.mix(h) between fc1 and fc2")
    return groups
