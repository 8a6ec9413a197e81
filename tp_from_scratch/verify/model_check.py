"""One configuration of ``verify model``: a source at one t and dtype, held to its single-device self.

    check_configuration(build, ctx, dtype, seed)   the verdict of one configuration on this rank

Phases, each compared under the tolerance policy (tp_from_scratch.compare, depth = the model's
layers, in its working precision):

    load       build the reference and the TP model from the same weights     -> refused at load
    forward    logits and loss on seeded random ids (B = 2, T = 7: odd, so no split of T is even)
    backward   every parameter's gradient, the TP one brought to its full shape
    AdamW      one step (lr 1e-2): the weights (float64; float32's bound would be lr/eps x 1e-5, the
               policy's "useless" case) and the loss of a second forward (steps = 1)
    generate   greedy ids, 5 new tokens, equal
    save/reload  the library's own round trip, bit-exact (where it offers one)

An exception in any phase after load is a crash: where (the innermost module running, the
library's file:line) and the message. A difference is located by the hooks of
verify.locator (forward records first, then the gradients'). Collective over the TP group.
"""
import torch

from tp_from_scratch.compare import allowed_error, max_error, tolerance
from tp_from_scratch.verify.locator import REPLICATED, Event, first_divergence, record, within
from tp_from_scratch.verify.recorder import describe

LR, NEW_TOKENS, SHAPE = 1e-2, 5, (2, 7)
EQUAL, DIFFERS, CRASHED, REFUSED = "equal", "differs", "crashed", "refused at load"


def seeded_ids(seed, vocab, shape=SHAPE):
    """(ids, targets): random token ids and next-token targets, the same on every rank of a group."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, shape, generator=g)
    return ids, torch.randint(0, vocab, shape, generator=g)


class Crash(Exception):
    """An exception in a phase, with where it happened."""

    def __init__(self, phase, where, error):
        super().__init__(describe(error))
        self.phase, self.where, self.error = phase, where, error


def _check(name, got, expected, bound, exact=False):
    """{name, ok, error, bound}: bit-exact when ``exact``."""
    same = tuple(got.shape) == tuple(expected.shape)
    error = max_error(got, expected) if same else float("inf")
    ok = same and (torch.equal(got, expected) if exact else within(got, expected, bound))
    return dict(name=name, ok=bool(ok), error=error, bound=0.0 if exact else bound)


def _worst(name, checks):
    """One check summing many: ok if all are, the worst error, the first failures named."""
    bad = [c["name"] for c in checks if not c["ok"]]
    worst = max(checks, key=lambda c: (not c["ok"], c["error"] / c["bound"] if c["bound"] else c["error"]))
    return dict(name=name, ok=not bad, error=worst["error"], bound=worst["bound"],
                detail=(f"{len(bad)} of {len(checks)} differ, first {', '.join(bad[:3])}" if bad else ""))


def check_configuration(build, ctx, dtype, seed=0, phase_seen=None):
    """The record of one configuration on this rank: verdict, phase, message, where, the
    first divergence's line and every check. ``build(ctx, dtype, seed)`` makes the Pair."""
    seen = phase_seen or (lambda phase: None)
    out = dict(verdict=EQUAL, phase="", message="", where="", divergence="", checks=[])
    seen("load")
    try:
        pair = build(ctx, dtype, seed)
    except Exception as error:  # noqa: BLE001 - the library's refusal is the verdict
        return dict(out, verdict=REFUSED, phase="load", message=describe(error))
    try:
        _run(pair, ctx, dtype, seed, out, seen)
    except Crash as crash:
        if out["divergence"]:   # it already differed: the verdict stays, the crash is told after
            out.update(verdict=DIFFERS, message=f"then crashed in {crash.phase}: {crash}")
        else:
            out.update(verdict=CRASHED, phase=crash.phase, where=crash.where, message=str(crash),
                       divergence=getattr(crash, "hint", ""))
    except Exception as error:  # noqa: BLE001 - outside the TP model's phases (the reference)
        out.update(verdict=CRASHED, phase="reference", message=describe(error))
    return out


def _phase(name, seen, running=None):
    """A context: announce the phase; an exception becomes a Crash naming the module running."""
    class _Guard:
        def __enter__(self):
            seen(name)

        def __exit__(self, kind, error, tb):
            if error is not None and not isinstance(error, Crash) and isinstance(error, Exception):
                where = running.running[-1] if running is not None and running.running else ""
                raise Crash(name, where, error) from error
            return False
    return _Guard()


def _run(pair, ctx, dtype, seed, out, seen):
    precision = pair.precision or dtype
    bound = lambda x, steps=0: allowed_error(x, tol=tolerance(precision, layers=pair.layers, steps=steps))  # noqa: E731
    ids, targets = seeded_ids(seed, pair.vocab_size)
    checks = out["checks"]
    ref_rec = record(pair.reference)
    ref_logits, ref_loss = pair.run(pair.reference, ids, targets)
    tp_rec = record(pair.parallel)
    try:
        with _phase("forward", seen, tp_rec):   # run() enters loss_parallel itself where it needs it
            logits, loss = pair.run(pair.parallel, ids, targets)
    except Crash as crash:
        crash.hint = crash_hint(pair, tp_rec, ref_rec, crash.where)
        raise
    # the model's outputs are its last records: the logits, then the loss
    for rec, (lg, ls) in ((ref_rec, (ref_logits, ref_loss)), (tp_rec, (logits, loss))):
        rec.events += [Event("output", "(logits)", lg.detach()), Event("output", "(loss)", ls.detach())]
    layout_of = _with_loss(pair.layout_of)
    with _phase("forward", seen):
        full_logits = _full(pair, layout_of("output", "(logits)", logits, ref_logits), logits)
        full_loss = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
        checks.append(_check("logits", full_logits, ref_logits.detach(), bound(ref_logits)))
        checks.append(_check("loss", full_loss.detach(), ref_loss.detach(), bound(ref_loss)))
    with _phase("backward", seen, tp_rec):
        ref_loss.backward()
        with pair.loss_context():
            loss.backward()
    mine = dict(pair.parallel.named_parameters())
    with _phase("backward", seen):
        grads = []
        for name, p in pair.reference.named_parameters():
            if name not in mine or mine[name].grad is None or p.grad is None:
                grads.append(dict(name=name, ok=p.grad is None and (name not in mine or mine[name].grad is None),
                                  error=float("inf"), bound=0.0))
                continue
            full = pair.full_parameter(name, mine[name].grad)
            grads.append(_check(name, full, p.grad, bound(p.grad)))
        checks.append(_worst("gradients", grads))
    ref_rec.remove()
    tp_rec.remove()
    if not all(c["ok"] for c in checks):
        with _phase("locate", seen):
            out["divergence"] = _locate(pair, ctx, dtype, precision, tp_rec, ref_rec, layout_of)
    with _phase("AdamW step", seen):
        _adamw(pair, dtype, ids, targets, bound, checks)
    if pair.generate is not None:
        prompt = ids[:, :4]
        with _phase("generate", seen):
            want = pair.generate(pair.reference, prompt, NEW_TOKENS)
            got = pair.generate(pair.parallel, prompt, NEW_TOKENS)
            checks.append(_check("generate", got, want, 0.0, exact=True))
    if pair.round_trip is not None:
        with _phase("save/reload", seen):
            trip = [_check(n, after, before, 0.0, exact=True) for n, before, after in pair.round_trip(pair.parallel)]
            checks.append(_worst("save/reload", trip))
    failed = [c for c in checks if not c["ok"]]
    if failed:
        out["verdict"] = DIFFERS
        out["divergence"] = out["divergence"] or f"first divergence: {failed[0]['name']}: " + (
            failed[0].get("detail") or f"largest error {failed[0]['error']:.3e}, bound {failed[0]['bound']:.1e}")


def _with_loss(layout_of):
    def layout(kind, name, local, reference):
        return REPLICATED if name == "(loss)" else layout_of(kind, name, local, reference)
    return layout


def _full(pair, layout, x):
    from tp_from_scratch.verify.locator import to_full
    if isinstance(layout, str) or layout is None:
        layout = REPLICATED
    return to_full(pair.group, x, layout)


def _locate(pair, ctx, dtype, precision, tp_rec, ref_rec, layout_of):
    """The first divergence's line: forward records first, then the backward's."""
    kw = dict(layout_of=layout_of, dtype=dtype, layers=pair.layers, precision=precision,
              head_size_of=pair.head_size_of)
    found = first_divergence(pair.group, tp_rec.events, ref_rec.events, kinds=("input", "output"), **kw)
    if found is None:
        backward = [e for e in tp_rec.events if e.kind == "output gradient"]
        found = first_divergence(pair.group, backward, ref_rec.events, kinds=("output gradient",), **kw)
        if found is not None:   # named by the module whose backward sent that gradient
            module = found.name.rsplit(" (", 1)[0]
            found.name = f"{_consumer(tp_rec, module)} (backward: the gradient it sends to {module}'s output)"
    return found.line() if found else ""


def _consumer(rec, name):
    """The module that read ``name``'s output: the next module called in the forward that is
    not inside ``name`` (its backward produced the gradient)."""
    outputs = [e.name for e in rec.events if e.kind == "output"]
    inputs = [e for e in rec.events if e.kind in ("input", "output")]
    after = False
    for e in inputs:
        if e.kind == "output" and e.name == name:
            after = True
        elif after and e.kind == "input" and not e.name.startswith(name + "."):
            return e.name
    return "the loss" if outputs else "(unknown)"


def _adamw(pair, dtype, ids, targets, bound, checks):
    ref_opt = torch.optim.AdamW(pair.reference.parameters(), lr=LR)
    tp_opt = torch.optim.AdamW(pair.parallel.parameters(), lr=LR)
    ref_opt.step()
    tp_opt.step()
    if dtype == torch.float64:
        mine = dict(pair.parallel.named_parameters())
        weights = []
        for name, p in pair.reference.named_parameters():
            if name in mine:
                full = pair.full_parameter(name, mine[name].detach())
                step_bound = allowed_error(p, tol=tolerance(pair.precision or dtype, layers=pair.layers, steps=1,
                                                            adamw_lr=LR))
                weights.append(_check(name, full, p.detach(), step_bound))
        checks.append(_worst("weights after AdamW", weights))
    with torch.no_grad():
        ref_loss = pair.run(pair.reference, ids, targets)[1]
        loss = pair.run(pair.parallel, ids, targets)[1]
    loss = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
    checks.append(_check("loss after AdamW", loss, ref_loss, bound(ref_loss, steps=1)))


def crash_hint(pair, tp_rec, ref_rec, where):
    """For a crash in the forward, the 'first divergence:' line read off the records alone (no
    collective: the ranks may have crashed in different places): the first record whose local
    shape the plan does not give (a head cut in two), else the crashing module's input, a piece
    where the module reads a whole tensor, else a parameter the plan cuts otherwise."""
    from torch.distributed.tensor import DTensor
    ref = {}
    for e in ref_rec.events:
        ref.setdefault((e.kind, e.name), e.tensor)
    layout_of = _with_loss(pair.layout_of)
    for e in tp_rec.events:
        expected = ref.get((e.kind, e.name))
        if expected is None:
            continue
        layout = layout_of(e.kind, e.name, e.tensor, expected)
        head = pair.head_size_of(e.name) if pair.head_size_of else None
        if isinstance(layout, str):
            return f"first divergence: {e.name} ({e.kind}): a head or expert split wrongly; {layout}"
        if head and layout is not None and layout.sharded and not isinstance(e.tensor, DTensor) \
                and e.tensor.shape[-1] % head:
            return (f"first divergence: {e.name} ({e.kind}): a head cut across ranks; each rank holds "
                    f"{e.tensor.shape[-1]} features, not a multiple of the head size {head}: heads (or KV "
                    "heads) split where they should be whole or replicated")
    inputs = [e for e in tp_rec.events if e.kind == "input" and e.name == where]
    if inputs and ("input", where) in ref:
        got, expected = inputs[-1].tensor, ref[("input", where)]
        whole = isinstance(got, DTensor) and all(p.is_replicate() for p in got.placements)
        if tuple(got.shape) != tuple(expected.shape) and (whole or layout_of("input", where, got, expected)
                                                          == REPLICATED and not isinstance(got, DTensor)):
            return (f"first divergence: {where} (input): Shard where Replicate was expected; it reads its "
                    f"input {tuple(_local_shape(got))} on each rank as the whole tensor, which on one device is "
                    f"{tuple(expected.shape)}: a layer planned as another style (a rowwise layer planned colwise?)")
    misplaced = pair.misplaced() if getattr(pair, "misplaced", None) else ""
    return f"first divergence: {misplaced}" if misplaced else ""


def _local_shape(x):
    return x.to_local().shape if hasattr(x, "to_local") else x.shape
