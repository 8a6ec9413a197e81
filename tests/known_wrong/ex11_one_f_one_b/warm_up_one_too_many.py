"""Known-wrong: a warm-up of p - s forwards instead of p - 1 - s: correct gradients, but
every stage holds one micro-batch more than 1F1B needs (the last stage two forwards ahead)."""
from tp_from_scratch.parallelisms.schedules import Action


def _forward(s, p, mb):
    return ([Action("recv_act", mb)] if s > 0 else []) + [Action("forward", mb)] + \
        ([Action("send_act", mb)] if s < p - 1 else [])


def _backward(s, p, mb):
    return ([Action("recv_grad", mb)] if s < p - 1 else []) + [Action("backward", mb)] + \
        ([Action("send_grad", mb)] if s > 0 else [])


def one_f_one_b(n_stages, n_micro):
    if n_stages < 1:
        raise ValueError(f"n_stages must be at least 1, got {n_stages}")
    if n_micro < 1:
        raise ValueError(f"n_micro must be at least 1, got {n_micro}")
    schedule = []
    for s in range(n_stages):
        warmup = min(n_stages - s, n_micro)  # should be n_stages - 1 - s
        program = [a for mb in range(warmup) for a in _forward(s, n_stages, mb)]
        for k in range(n_micro - warmup):
            program += _forward(s, n_stages, warmup + k) + _backward(s, n_stages, k)
        for mb in range(n_micro - warmup, n_micro):
            program += _backward(s, n_stages, mb)
        schedule.append(program)
    return schedule
