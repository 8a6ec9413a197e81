"""The divergence locator: where a tensor-parallel model first parts from its single-device self.

Forward hooks on every module of both models record, in execution order, each module's input
and output (and, through a hook on each output tensor, the gradient that reaches it in the
backward). After the step, every record of the TP model is brought to its full tensor

    a DTensor                      full_tensor()
    a plain tensor, Replicated     as it is (every rank holds all of it)
    a plain tensor, Sharded(d)     every rank's piece all-gathered along d, in rank order
                                   (r neighbouring ranks holding the same piece: one copy)

(the layout comes from the source: the plan's styles for this course's models, the shape next
to the reference's for a library whose outputs are plain tensors), and compared with the
reference's record of the same name under the tolerance policy. The first record beyond it is
the first divergence; ``diagnose`` says what it looks like:

    Partial where Replicate was expected   the ranks' values sum to the reference: a missing all-reduce
    x t                                     t times the reference: an extra all-reduce, or a loss
                                            counted on every rank
    Shard where Replicate was expected      a piece where the whole was promised: a missing all-gather
    rows permuted                           the reference's blocks in another order: heads or experts
                                            split wrongly
    a head cut across ranks                 a projection's local width is no multiple of the head size
    on rank r only                          the other ranks' pieces are right

Every call here that gathers is collective over the TP group: all ranks make the same calls in
the same order, because they hold the same records (SPMD).
"""
from dataclasses import dataclass, field

import torch
from torch.distributed.tensor import DTensor

from tp_from_scratch.compare import allowed_error, max_error, tolerance
from tp_from_scratch.nn.collectives import all_gather, all_reduce, tp_world_size


@dataclass(frozen=True)
class Layout:
    """How a plain tensor lies on the ranks: Replicated, or Sharded(dim) with ``replicas``
    neighbouring ranks holding each piece (a KV head shared by several ranks)."""
    sharded: bool = False
    dim: int = -1
    replicas: int = 1
    partial: bool = False    # a partial sum the next collective completes: its full tensor is the sum

    def __str__(self):
        if self.partial:
            return "Partial"
        if not self.sharded:
            return "Replicated"
        return f"Sharded({self.dim})" + (f" x{self.replicas} replicas" if self.replicas > 1 else "")


REPLICATED = Layout()


def sharded(dim=-1, replicas=1):
    return Layout(True, dim, replicas)


def first_tensor(value):
    """The first tensor in a module's output (a tensor, a tuple, a transformers ModelOutput)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for v in value:
            found = first_tensor(v)
            if found is not None:
                return found
    return None


def infer_layout(local, reference):
    """A plain tensor's layout read off its shape next to the reference's: the one dim whose
    size differs is the sharded one; equal shapes mean Replicated."""
    if isinstance(local, DTensor) or tuple(local.shape) == tuple(reference.shape) or local.dim() != reference.dim():
        return REPLICATED
    dims = [d for d in range(local.dim()) if local.shape[d] != reference.shape[d]]
    return sharded(dims[0] - local.dim()) if len(dims) == 1 else REPLICATED


def gather_pieces(group, x):
    """Every rank's tensor ``x`` (shapes may differ), in rank order. Collective over ``group``."""
    x = x.detach().contiguous()
    shapes = all_gather(group, torch.tensor([list(x.shape)], dtype=torch.long), dim=0)
    sizes = [int(s.prod()) for s in shapes]
    flat = all_gather(group, x.reshape(-1), dim=0, sizes=sizes)
    return [p.reshape(s.tolist()) for p, s in zip(flat.split(sizes), shapes)]


def to_full(group, local, layout):
    """The full tensor of a TP record (see the module docstring). Collective for a sharded one."""
    if isinstance(local, DTensor):
        return local.full_tensor().detach()
    if layout.partial:
        return all_reduce(group, local.detach())
    if not layout.sharded:
        return local.detach()
    pieces = gather_pieces(group, local)
    dim = layout.dim % local.dim()
    return torch.cat(pieces[::layout.replicas], dim=dim)


@dataclass
class Event:
    """One recorded tensor: ``kind`` is "input", "output" or "output gradient"."""
    kind: str
    name: str
    tensor: torch.Tensor


@dataclass
class Recording:
    """Every module's input and output (and output gradient) in execution order, and the
    modules being run right now (for a crash: the innermost one)."""
    events: list = field(default_factory=list)
    running: list = field(default_factory=list)
    grads: bool = True
    hooks: list = field(default_factory=list)

    def remove(self):
        for h in self.hooks:
            h.remove()
        self.hooks.clear()


def record(model, grads=True):
    """Hook every named module of ``model``; returns the Recording the hooks fill."""
    rec = Recording(grads=grads)
    for name, module in model.named_modules():
        if not name:
            continue
        rec.hooks.append(module.register_forward_pre_hook(_pre(rec, name), with_kwargs=True))
        rec.hooks.append(module.register_forward_hook(_post(rec, name)))
    return rec


def _pre(rec, name):
    def hook(module, args, kwargs):
        rec.running.append(name)
        x = first_tensor(list(args) + list(kwargs.values()))
        if x is not None and x.is_floating_point():
            rec.events.append(Event("input", name, x.detach().clone()))
    return hook


def _post(rec, name):
    def hook(module, args, output):
        if rec.running and rec.running[-1] == name:
            rec.running.pop()
        y = first_tensor(output)
        if y is None or not y.is_floating_point():
            return
        event = Event("output", name, y.detach().clone())
        rec.events.append(event)
        if rec.grads and y.requires_grad:
            def keep(grad, name=name):
                rec.events.append(Event("output gradient", name, grad.detach().clone()))
            y.register_hook(keep)
    return hook


def _keyed(events):
    """{(kind, name, k): tensor}, k counting a module's calls, in order."""
    seen, out = {}, {}
    for e in events:
        k = seen.get((e.kind, e.name), 0)
        seen[(e.kind, e.name)] = k + 1
        out[(e.kind, e.name, k)] = e.tensor
    return out


@dataclass
class Divergence:
    """What the locator found: the record, the pattern and a one-line description."""
    kind: str
    name: str
    pattern: str
    detail: str
    error: float = float("inf")
    bound: float = 0.0

    def line(self):
        return f"first divergence: {self.name}: {self.pattern}; {self.detail}"


def bound_for(reference, dtype, layers, precision=None):
    """The policy's allowed error for a record: TOLERANCE x depth x max(1, max |reference|), in
    the model's working precision (transformers' float32 islands make a float64 model's
    working precision float32)."""
    return allowed_error(reference, tol=tolerance(precision or dtype, layers=layers))


def within(got, expected, bound):
    return tuple(got.shape) == tuple(expected.shape) and bool(torch.isfinite(got).all() ==
                                                              torch.isfinite(expected).all()) \
        and max_error(got, expected) <= bound


def first_divergence(group, tp_events, ref_events, *, layout_of, dtype, layers, precision=None,
                     kinds=("input", "output"), head_size_of=None):
    """The first TP record (in execution order, of ``kinds``) beyond tolerance, as a Divergence,
    or None. ``layout_of(kind, name, local, reference)`` gives a plain tensor's Layout.
    Collective over ``group`` (every rank passes the same records in the same order)."""
    ref = _keyed(ref_events)
    order, seen = [], {}
    for e in tp_events:
        k = seen.get((e.kind, e.name), 0)
        seen[(e.kind, e.name)] = k + 1
        if e.kind in kinds and (e.kind, e.name, k) in ref:
            order.append((e, ref[(e.kind, e.name, k)]))
    previous = None
    for event, expected in order:
        found = compare_event(group, event, expected, layout_of=layout_of, dtype=dtype, layers=layers,
                              precision=precision, head_size_of=head_size_of, previous=previous)
        if found is not None:
            return found
        previous = event
    return None


def compare_event(group, event, expected, *, layout_of, dtype, layers, precision=None,
                  head_size_of=None, previous=None):
    """A Divergence if this record's full tensor is beyond tolerance, else None (collective)."""
    local = event.tensor
    layout = layout_of(event.kind, event.name, local, expected)
    if layout is None:        # a record the source does not lay out: not compared
        return None
    head = head_size_of(event.name) if head_size_of else None
    problem = layout if isinstance(layout, str) else None
    if problem is None and head and layout.sharded and not isinstance(local, DTensor) and local.shape[-1] % head:
        problem = (f"each rank holds {local.shape[-1]} features of this projection, not a multiple of the "
                   f"head size {head}: heads (or KV heads) split where they should be whole or replicated")
    # a shape problem may show on some ranks only (an uneven split): decide together
    flags = all_gather(group, torch.tensor([problem is not None], dtype=torch.long), dim=0)
    if flags.any():
        ranks = ", ".join(str(r) for r, f in enumerate(flags.tolist()) if f)
        return Divergence(event.kind, f"{event.name} ({event.kind})", "a head or expert split wrongly",
                          problem or f"rank(s) {ranks} hold a piece their plan does not give them")
    full = to_full(group, local, layout)
    bound = bound_for(expected, dtype, layers, precision)
    # a Replicated record may differ on some ranks only: decide together
    fine = all_gather(group, torch.tensor([within(full, expected, bound)], dtype=torch.long), dim=0)
    if fine.all():
        return None
    pieces = None
    if not isinstance(local, DTensor):
        pieces = gather_pieces(group, local)
    elif len(local.placements) == 1 and local.placements[0].is_shard():   # its pieces, in rank order
        pieces, layout = gather_pieces(group, local.to_local()), sharded(local.placements[0].dim % local.dim() - local.dim())
    pattern, detail = diagnose(full, expected, pieces, layout, bound, tp_world_size(group), head)
    if event.kind == "input" and previous is not None and not previous.name.startswith(event.name):
        parent = _owner(event.name)
        detail += (f"; {previous.name}'s {previous.kind} was still equal, so the difference comes from "
                   f"{parent}'s own code between them")
        where = f"{parent}, in its own code before {event.name}"
    else:
        where = f"{event.name} ({event.kind})"
    return Divergence(event.kind, where, pattern, detail, max_error(full, expected) if
                      full.shape == expected.shape else float("inf"), bound)


def _owner(name):
    """The module whose own code runs just before ``name`` is called: its parent, or for an entry
    of a ModuleList ('model.layers.1') the list's owner ('model')."""
    parent = name.rpartition(".")[0]
    if name.rpartition(".")[2].isdigit():
        parent = parent.rpartition(".")[0]
    return parent or "(the model)"


def _close(a, b, bound):
    return tuple(a.shape) == tuple(b.shape) and max_error(a, b) <= bound


def diagnose(full, expected, pieces, layout, bound, t, head=None):
    """(pattern, detail) of a record beyond tolerance: see the module docstring."""
    if tuple(full.shape) != tuple(expected.shape):
        local = pieces[0].shape if pieces else full.shape
        if pieces and tuple(pieces[0].shape) != tuple(expected.shape) and not layout.sharded:
            return ("Shard where Replicate was expected (a missing all-gather)",
                    f"each rank holds {tuple(local)} where the reference has {tuple(expected.shape)}")
        return "shape differs", f"full shape {tuple(full.shape)}, reference {tuple(expected.shape)}"
    err = max_error(full, expected)
    detail = f"largest error {err:.3e}, bound {bound:.1e}"
    if _close(full, expected * t, bound * t):
        return ("x t (an extra all-reduce, or a loss counted on every rank)",
                f"{t} times the reference; {detail}")
    if pieces and not layout.sharded and all(tuple(p.shape) == tuple(expected.shape) for p in pieces):
        total = torch.stack(pieces).sum(0)
        if _close(total, expected, bound * t):
            return ("Partial where Replicate was expected (a missing all-reduce)",
                    f"the ranks hold different values whose sum is the reference; {detail}")
    blocks = full.dim() and _permutation(full, expected, bound,
                                         head or (full.shape[-1] // t if full.shape[-1] % t == 0 else 0))
    if blocks:
        return "rows permuted (heads or experts split wrongly)", f"blocks of the last dim in the order {blocks}; {detail}"
    if pieces and layout.sharded:
        ref_pieces = torch.tensor_split(expected, t // layout.replicas, dim=layout.dim)
        wrong = [r for r, p in enumerate(pieces)
                 if not _close(p, ref_pieces[r // layout.replicas], bound)]
        if 0 < len(wrong) < t:
            return f"wrong on rank{'s' if len(wrong) > 1 else ''} {', '.join(map(str, wrong))} only", detail
    return "values differ", detail


def _permutation(full, expected, bound, block):
    """The order of ``expected``'s last-dim blocks that ``full`` holds, if it is a non-trivial
    permutation of them; else None."""
    if not block or full.shape[-1] % block or full.shape[-1] // block < 2:
        return None
    got, ref = full.split(block, dim=-1), expected.split(block, dim=-1)
    order = []
    for g in got:
        match = [j for j, r in enumerate(ref) if _close(g, r, bound) and j not in order]
        if not match:
            return None
        order.append(match[0])
    return order if order != sorted(order) else None
