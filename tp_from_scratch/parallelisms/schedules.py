"""Pipeline schedules as data: each stage's ordered list of actions over m micro-batches.

A schedule is a list with one entry per stage; each entry is that stage's program, a list of
``Action(op, mb)``. Six operations, named after the messages of a pipeline:

    recv_act  i   receive micro-batch i's activations from the previous stage (not on stage 0)
    forward   i   run this stage's layers on micro-batch i (the last stage adds the loss)
    send_act  i   send micro-batch i's output activations to the next stage (not on the last)
    recv_grad i   receive the gradient of those outputs from the next stage (not on the last)
    backward  i   backpropagate micro-batch i through this stage's layers
    send_grad i   send the gradient of micro-batch i's inputs to the previous stage (not on 0)

Two schedules (p stages, m micro-batches; stage s counts from 0):

    GPipe   every stage: F0 F1 .. F(m-1), then B0 B1 .. B(m-1). A stage keeps all m
            micro-batches' activations until its backwards start.
    1F1B    stage s runs min(p-1-s, m) warm-up forwards, then alternates one forward and
            one backward, then drains the remaining backwards. At most min(p-s, m)
            micro-batches are in flight on stage s: the activation memory no longer grows with m.

Both leave the same bubble: with equal costs per micro-batch, each stage idles for p-1
forward+backward slots out of m+p-1, a fraction (p-1)/(m+p-1) (``bubble_formula``).
``simulate`` runs a schedule on an idealised clock (sends arrive at once, receives block) and
``bubble`` measures the idle time of such a timeline, or of one timed on real ranks.

Sends are buffered (``Comm.send`` returns at once), so only the receives can block: a schedule
deadlocks when every stage still working waits for a message nobody has sent yet.
"""
from typing import NamedTuple

OPS = ("recv_act", "forward", "send_act", "recv_grad", "backward", "send_grad")
SHORT = {"recv_act": "ra", "forward": "F", "send_act": "sa", "recv_grad": "rg",
         "backward": "B", "send_grad": "sg"}
COMPUTE = ("forward", "backward")


class Action(NamedTuple):
    """One step of a stage's program: ``op`` (one of OPS) on micro-batch ``mb``."""
    op: str
    mb: int

    def __str__(self):
        return f"{SHORT[self.op]}{self.mb}"


def check_sizes(n_stages, n_micro):
    """Raise a ValueError unless there is at least one stage and one micro-batch."""
    if n_stages < 1:
        raise ValueError(f"n_stages must be at least 1, got {n_stages}")
    if n_micro < 1:
        raise ValueError(f"n_micro must be at least 1, got {n_micro}")


def forward_actions(stage, n_stages, mb):
    """[recv_act] forward [send_act] of micro-batch ``mb`` on ``stage``: the ends skip a message."""
    return ([Action("recv_act", mb)] if stage > 0 else []) + [Action("forward", mb)] + \
        ([Action("send_act", mb)] if stage < n_stages - 1 else [])


def backward_actions(stage, n_stages, mb):
    """[recv_grad] backward [send_grad] of micro-batch ``mb`` on ``stage``."""
    return ([Action("recv_grad", mb)] if stage < n_stages - 1 else []) + [Action("backward", mb)] + \
        ([Action("send_grad", mb)] if stage > 0 else [])


def gpipe(n_stages, n_micro):
    """GPipe: on every stage all m forwards, then all m backwards (in micro-batch order)."""
    check_sizes(n_stages, n_micro)
    return [[a for mb in range(n_micro) for a in forward_actions(s, n_stages, mb)]
            + [a for mb in range(n_micro) for a in backward_actions(s, n_stages, mb)]
            for s in range(n_stages)]


def one_f_one_b(n_stages, n_micro):
    """1F1B: warm-up forwards, then one forward one backward, then the remaining backwards.

    Stage s warms up with min(p-1-s, m) forwards: the micro-batches that must pass it before
    the first one comes back from the last stage. Returns a fresh list per call.
    """
    check_sizes(n_stages, n_micro)
    schedule = []
    for s in range(n_stages):
        warmup = min(n_stages - 1 - s, n_micro)
        program = [a for mb in range(warmup) for a in forward_actions(s, n_stages, mb)]
        for k in range(n_micro - warmup):   # steady state: F(warmup + k), then B(k)
            program += forward_actions(s, n_stages, warmup + k) + backward_actions(s, n_stages, k)
        for mb in range(n_micro - warmup, n_micro):  # cool-down
            program += backward_actions(s, n_stages, mb)
        schedule.append(program)
    return schedule


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}


def schedule_for(schedule, n_stages, n_micro):
    """A schedule by name ("gpipe", "1f1b") or as given (a list of per-stage programs, checked
    by ``check_schedule`` first, so a broken one fails by name instead of hanging a pipeline)."""
    if isinstance(schedule, str):
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {sorted(SCHEDULES)} or a list of programs, "
                             f"got {schedule!r}")
        return SCHEDULES[schedule](n_stages, n_micro)
    if len(schedule) != n_stages:
        raise ValueError(f"the schedule has {len(schedule)} programs for {n_stages} stages")
    check_schedule(schedule, n_micro)
    return schedule


def format_schedule(schedule):
    """One line per stage, e.g. 'stage 1: ra0 F0 sa0 ra1 F1 sa1 rg0 B0 sg0 ...'."""
    return "\n".join(f"stage {s}: " + " ".join(map(str, program)) for s, program in enumerate(schedule))


def in_flight(program):
    """The most micro-batches forwarded and not yet backwarded at any point of ``program``."""
    live = peak = 0
    for action in program:
        live += {"forward": 1, "backward": -1}.get(action.op, 0)
        peak = max(peak, live)
    return peak


def check_schedule(schedule, n_micro):
    """Raise a ValueError naming the first broken rule of a pipeline schedule.

    Rules: every stage forwards and backwards each micro-batch exactly once, forward first;
    a stage receives a micro-batch's activations before its forward and its output gradient
    before its backward (the first stage receives no activations, the last no gradients),
    and sends after computing them; each send is matched by the neighbour's receive of the
    same micro-batch, in the same order (a channel is first in, first out); and the whole
    runs without deadlock (``simulate``).
    """
    n = len(schedule)
    for s, program in enumerate(schedule):
        wanted = {(op, mb) for mb in range(n_micro) for op in
                  [a.op for a in forward_actions(s, n, mb) + backward_actions(s, n, mb)]}
        got = [(a.op, a.mb) for a in program]
        if sorted(got) != sorted(wanted):
            extra, missing = sorted(set(got) - wanted), sorted(wanted - set(got))
            raise ValueError(f"stage {s}: expected each of {len(wanted)} actions once; "
                             f"missing {missing}, unexpected {extra}, "
                             f"repeated {sorted({x for x in got if got.count(x) > 1})}")
        position = {x: i for i, x in enumerate(got)}
        for mb in range(n_micro):
            order = [op for op in OPS if (op, mb) in position]
            for before, after in zip(order, order[1:]):
                if position[(before, mb)] > position[(after, mb)]:
                    raise ValueError(f"stage {s}: {after} of micro-batch {mb} comes before its {before}")
    for s in range(n - 1):  # the channels s -> s+1 (activations) and s+1 -> s (gradients)
        for send, recv, src, dst in (("send_act", "recv_act", s, s + 1), ("send_grad", "recv_grad", s + 1, s)):
            sent = [a.mb for a in schedule[src] if a.op == send]
            received = [a.mb for a in schedule[dst] if a.op == recv]
            if sent != received:
                raise ValueError(f"stage {src} sends micro-batches {sent} ({send}) but stage {dst} "
                                 f"receives {received} ({recv}): a channel delivers in order")
    simulate(schedule)


def simulate(schedule, t_forward=1.0, t_backward=2.0):
    """Run a schedule on an ideal clock: per stage, a list of (op, mb, start, end) for every action.

    Forward and backward take ``t_forward`` and ``t_backward``; messages take no time;
    a receive waits until the matching send has happened. Raises a ValueError naming the
    waiting stages if the schedule deadlocks.
    """
    n = len(schedule)
    clock = [0.0] * n
    next_action = [0] * n
    timelines = [[] for _ in range(n)]
    sent = {}  # (op, src, mb) -> time the message left
    cost = {"forward": t_forward, "backward": t_backward}
    source = {"recv_act": ("send_act", -1), "recv_grad": ("send_grad", +1)}
    while any(next_action[s] < len(schedule[s]) for s in range(n)):
        moved = False
        for s in range(n):
            while next_action[s] < len(schedule[s]):
                op, mb = schedule[s][next_action[s]]
                start = clock[s]
                if op in source:
                    key = (source[op][0], s + source[op][1], mb)
                    if key not in sent:
                        break  # blocked: try the other stages
                    start = max(start, sent[key])
                end = start + cost.get(op, 0.0)
                if op in ("send_act", "send_grad"):
                    sent[(op, s, mb)] = end
                timelines[s].append((op, mb, start, end))
                clock[s] = end
                next_action[s] += 1
                moved = True
        if not moved:
            waiting = [f"stage {s} waits at {schedule[s][next_action[s]]}"
                       for s in range(n) if next_action[s] < len(schedule[s])]
            raise ValueError("deadlock: " + "; ".join(waiting))
    return timelines


def bubble(timelines):
    """Idle time of a run: dict with span, busy and idle per stage, and the bubble fraction.

    ``timelines``: per stage, (op, mb, start, end) tuples (from ``simulate`` or timed on
    ranks with a shared clock). Busy time is forward and backward compute; everything else
    between the first start and the last end on any stage (waiting for messages) is idle.
    The bubble fraction is the idle share of all stages' time: mean idle / span.
    """
    start = min(t[2] for tl in timelines for t in tl)
    span = max(t[3] for tl in timelines for t in tl) - start
    busy = [sum(end - begin for op, _, begin, end in tl if op in COMPUTE) for tl in timelines]
    idle = [span - b for b in busy]
    return {"span": span, "busy": busy, "idle": idle, "fraction": sum(idle) / (len(idle) * span)}


def bubble_formula(n_stages, n_micro):
    """(p-1)/(m+p-1): the idle fraction of GPipe and 1F1B when every slot costs the same."""
    return (n_stages - 1) / (n_micro + n_stages - 1)
