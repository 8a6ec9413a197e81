"""Checks that run a layer as a model does outside one forward and one backward (contract 3).

    two forwards, then backwards   Y1 = L(X1), Y2 = L(X2), then Y1.backward(dY1), Y2.backward(dY2)
        (column, row, embedding, sp layernorm, sp block): each Y, each dX and the parameter
        gradients, summed over both. Weight tying, several micro-batches through one module and
        activation recomputation all run a module twice before its backward; a layer that keeps
        its input in a module attribute for dW (not in autograd's saved tensors) computes both
        dW terms from X2.
    no_grad / inference_mode forward   Y = L(X) with autograd on, under torch.no_grad() and under
        torch.inference_mode() (every component), each against the single-device reference:
        generation and evaluation run without autograd, and a layer whose collective sits in
        an autograd-only path (skipped when grad is off) returns partial sums there.

Data as in the other checks: one seed, the same full layer and input on every rank (rank_rng(seed,
0)), or each rank's own where the component sums over ranks (g, sp scatter); the reference needs
no communication. Collective over the TP group (the layer's own collectives).
"""
import copy
import inspect

import torch
from torch import nn
from torch.nn import functional as F

from tp_from_scratch.nn.mappings import tp_rank, tp_world_size
from tp_from_scratch.testing import random_array, rank_rng
from tp_from_scratch.verify import sp

FEATURES, BATCH, VOCAB = 12, (2, 3), 12
TWO_FORWARDS = "two forwards, then backwards"
NO_GRAD = "no_grad / inference_mode forward"


def _tensor(a, dtype, device, grad=False):
    return torch.tensor(a, dtype=dtype, device=device, requires_grad=grad)


class Setup:
    """One component, built the same way on every rank: the reference and the adapter's layer,
    how to draw an input (the reference's and this rank's), and this rank's part of each result."""

    def __init__(self, reference, layer, draw, mine_out, mine_in, params, call=None):
        self.reference, self.layer, self.draw = reference, layer, draw
        self.mine_out, self.mine_in, self.params = mine_out, mine_in, params   # (full) -> this rank's
        self.call = call or (lambda module, x: module(x))


def _linear(rng, n_in, n_out, dtype, device):
    layer = nn.utils.skip_init(nn.Linear, n_in, n_out, dtype=dtype, device=device)
    with torch.no_grad():
        layer.weight.copy_(_tensor(random_array(rng, (n_out, n_in)), dtype, device))
        layer.bias.copy_(_tensor(random_array(rng, (n_out,)), dtype, device))
    return layer


def setup(component, adapter, group, dtype, seed, device="cpu"):
    """The Setup of a layer component (column, row, embedding, sp layernorm, sp block)."""
    rank, t = tp_rank(group), tp_world_size(group)
    rng = rank_rng(seed, 0)
    if component in ("column", "row"):
        reference = _linear(rng, FEATURES, FEATURES, dtype, device)
        make = adapter.column if component == "column" else adapter.row
        layer = make(group, copy.deepcopy(reference))
        lo, hi = adapter.layout(FEATURES, rank, t)

        def draw(rng):
            x = random_array(rng, (*BATCH, FEATURES))
            x_ref = _tensor(x, dtype, device, True)
            x_tp = _tensor(x if component == "column" else x[..., lo:hi], dtype, device, True)
            return x_ref, x_tp
        block = lambda y: y[..., lo:hi]  # noqa: E731
        whole = lambda y: y  # noqa: E731
        if component == "column":
            params = [("dW", lambda m: m.weight, lambda g: g[lo:hi]), ("db", lambda m: m.bias, lambda g: g[lo:hi])]
            return Setup(reference, layer, draw, block, whole, params)
        params = [("dW", lambda m: m.weight, lambda g: g[:, lo:hi]), ("db", lambda m: m.bias, whole)]
        return Setup(reference, layer, draw, whole, block, params)
    if component == "embedding":
        table = random_array(rng, (VOCAB, 6))
        reference = nn.Embedding.from_pretrained(_tensor(table, dtype, device), freeze=False)
        layer = adapter.embedding(group, copy.deepcopy(reference))
        lo, hi = adapter.layout(VOCAB, rank, t)

        def draw(rng):
            ids = torch.tensor(rng.integers(0, VOCAB, size=(3, 5)), device=device)
            return ids, ids
        return Setup(reference, layer, draw, lambda y: y, None, [("dE", lambda m: m.weight, lambda g: g[lo:hi])])
    # the sequence-parallel layers: (B, T, H) with T split by layout
    B, T, H = sp.SHAPE
    blocks = [slice(*adapter.layout(T, r, t)) for r in range(t)]
    mine = blocks[rank]
    if component == "sp layernorm":
        reference = nn.LayerNorm(H, dtype=dtype, device=device)
        with torch.no_grad():
            reference.weight.copy_(_tensor(1 + 0.1 * random_array(rng, (H,)), dtype, device))
            reference.bias.copy_(_tensor(random_array(rng, (H,)), dtype, device))
        layer = adapter.sp_layernorm(group, copy.deepcopy(reference))
        params = [("dW", lambda m: m.weight, lambda g: g), ("db", lambda m: m.bias, lambda g: g)]
    else:
        reference = sp.Block(hidden=H, dtype=dtype).to(device)
        with torch.no_grad():
            for p in reference.parameters():
                p.copy_(_tensor(random_array(rng, tuple(p.shape)), dtype, device))
        layer = adapter.sp_block(group, copy.deepcopy(reference))
        lo, hi = adapter.layout(sp.FFN, rank, t)
        params = [(f"{module}.{field}", lambda m, module=module, field=field: getattr(getattr(m, module), field),
                   cut) for module, field, cut in (
            ("ln", "weight", lambda g: g), ("ln", "bias", lambda g: g), ("fc1", "weight", lambda g: g[lo:hi]),
            ("fc1", "bias", lambda g: g[lo:hi]), ("fc2", "weight", lambda g: g[:, lo:hi]), ("fc2", "bias", lambda g: g))]
    sizes = sp._sizes(layer.forward, blocks, t)

    def draw(rng):
        x = random_array(rng, (B, T, H))
        return _tensor(x, dtype, device, True), _tensor(x[:, mine], dtype, device, True)
    return Setup(reference, layer, draw, lambda y: y[:, mine], lambda y: y[:, mine], params,
                 call=lambda module, x: module(x, **sizes) if module is layer else module(x))


def check_two_forwards(group, dtype, seed, *, component, adapter, judge, device="cpu"):
    """Two forwards through the same module, then the two backwards (see the module docstring)."""
    rank = tp_rank(group)
    s = setup(component, adapter, group, dtype, seed, device)
    rng = rank_rng(seed, 1)
    (x1_ref, x1), (x2_ref, x2) = s.draw(rng), s.draw(rng)
    y1_ref, y2_ref = s.call(s.reference, x1_ref), s.call(s.reference, x2_ref)
    dy1, dy2 = (_tensor(random_array(rng, tuple(y1_ref.shape)), dtype, device) for _ in range(2))
    y1_ref.backward(dy1)
    y2_ref.backward(dy2)
    with judge.phase("forward"):
        y1 = s.call(s.layer, x1)
        y2 = s.call(s.layer, x2)
    with judge.phase("backward"):
        y1.backward(s.mine_out(dy1))
        y2.backward(s.mine_out(dy2))
    judge.match(y1, s.mine_out(y1_ref), name="Y (first forward)", rank=rank)
    judge.match(y2, s.mine_out(y2_ref), name="Y (second forward)", rank=rank)
    if s.mine_in is not None:
        judge.match(x1.grad, s.mine_in(x1_ref.grad), name="dX (first forward)", rank=rank)
        judge.match(x2.grad, s.mine_in(x2_ref.grad), name="dX (second forward)", rank=rank)
    for name, get, cut in s.params:
        mine, ref = get(s.layer), get(s.reference)
        if ref is None or mine is None:
            continue
        label = name if name.startswith("d") else f"{'db' if name.endswith('bias') else 'dW'} {name}"
        judge.match(sp._grad(mine), cut(ref.grad), name=f"{label} (both backwards)", rank=rank)


# --- forward without autograd ----------------------------------------------------------------

def _mapping_forward(kind, fn, group, dtype, seed, layout, device):
    """(call, x_tp, expected): a mapping's input on this rank and its single-device output."""
    rank, t = tp_rank(group), tp_world_size(group)
    drawn = [rank_rng(seed, r) for r in range(t)]
    if kind in ("f", "g", "scatter", "gather"):
        xs = [random_array(rng, (*BATCH, FEATURES)) for rng in drawn]
        blocks = [slice(*layout(FEATURES, r, t)) for r in range(t)]
        x, y = {"f": (xs[0], xs[0]), "g": (xs[rank], sum(xs)),
                "scatter": (xs[0], xs[0][..., blocks[rank]]),
                "gather": (xs[rank][..., blocks[rank]],
                           torch.cat([torch.as_tensor(xs[r][..., blocks[r]]) for r in range(t)], -1).numpy())}[kind]
        sizes = {"sizes": [b.stop - b.start for b in blocks]} if FEATURES % t and \
            "sizes" in inspect.signature(fn).parameters else {}
    else:
        B, T, H = sp.SHAPE
        blocks = [slice(*layout(T, r, t)) for r in range(t)]
        if kind == "sp gather":
            xs = [random_array(rng, sp.SHAPE)[:, blocks[r]] for r, rng in enumerate(drawn)]
            x, y = xs[rank], torch.cat([torch.as_tensor(a) for a in xs], 1).numpy()
            sizes = sp._sizes(fn, blocks, t)
        else:
            xs = [random_array(rng, sp.SHAPE) for rng in drawn]
            x, y, sizes = xs[rank], sum(xs)[:, blocks[rank]], {}
    return (lambda x: fn(group, x, **sizes)), _tensor(x, dtype, device, True), _tensor(y, dtype, device)


def _cross_entropy_forward(fn, group, dtype, seed, layout, device):
    rank, t = tp_rank(group), tp_world_size(group)
    rng = rank_rng(seed, 0)
    logits = random_array(rng, (3, 5, VOCAB))
    target = torch.tensor(rng.integers(0, VOCAB, size=(3, 5)), device=device)
    lo, hi = layout(VOCAB, rank, t)
    expected = F.cross_entropy(_tensor(logits, dtype, device).reshape(-1, VOCAB), target.reshape(-1))
    return (lambda z: fn(group, z, target, -100, lo)), _tensor(logits[..., lo:hi], dtype, device, True), expected


def check_no_grad_forward(group, dtype, seed, *, component, adapter, judge, device="cpu"):
    """The forward with autograd on, under torch.no_grad() and under torch.inference_mode(), each
    against the single-device output (see the module docstring)."""
    rank = tp_rank(group)
    field = component.replace(" ", "_").replace("-", "_")
    if component in ("f", "g", "scatter", "gather", "sp gather", "sp scatter"):
        call, x, expected = _mapping_forward(component, getattr(adapter, field), group, dtype, seed,
                                             adapter.layout, device)
    elif component == "cross-entropy":
        call, x, expected = _cross_entropy_forward(adapter.cross_entropy, group, dtype, seed, adapter.layout, device)
    else:
        s = setup(component, adapter, group, dtype, seed, device)
        x_ref, x = s.draw(rank_rng(seed, 1))
        with torch.no_grad():
            expected = s.mine_out(s.call(s.reference, x_ref))
        call = lambda x: s.call(s.layer, x)  # noqa: E731
    for mode, context in (("autograd on", torch.enable_grad), ("torch.no_grad()", torch.no_grad),
                          ("torch.inference_mode()", torch.inference_mode)):
        fresh = x.detach().clone().requires_grad_(x.requires_grad)  # a library may work in place
        with judge.phase("forward"), context():
            y = call(fresh)
        name = "Y (autograd on)" if mode == "autograd on" else f"no-grad Y under {mode}"
        judge.match(y.detach(), expected.detach(), name=name, rank=rank)


LAYERS = ("column", "row", "embedding", "sp layernorm", "sp block")
ALL = ("column", "row", "embedding", "f", "g", "scatter", "gather", "cross-entropy",
       "sp gather", "sp scatter", "sp layernorm", "sp block")


def cases(Case, component):
    """This component's contract-3 cases (suite.all_cases appends them after its own)."""
    field = component.replace(" ", "_").replace("-", "_")
    out = []
    if component in LAYERS:
        out.append(Case(component, TWO_FORWARDS, lambda r: check_two_forwards(
            r.group, r.dtype, r.seed, component=component, adapter=r.adapter, judge=r.judge, device=r.device),
            field, since=3, note="two forwards through the module before their backwards"))
    out.append(Case(component, NO_GRAD, lambda r: check_no_grad_forward(
        r.group, r.dtype, r.seed, component=component, adapter=r.adapter, judge=r.judge, device=r.device),
        field, since=3, note="the forward under torch.no_grad() and torch.inference_mode()"))
    return out
