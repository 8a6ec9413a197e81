"""Known-wrong: the cool-down runs the remaining backwards newest first. The next stage sends
their gradients oldest first, so the channel hands this stage the wrong micro-batch's gradient."""
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
        warmup = min(n_stages - 1 - s, n_micro)
        program = [a for mb in range(warmup) for a in _forward(s, n_stages, mb)]
        for k in range(n_micro - warmup):
            program += _forward(s, n_stages, warmup + k) + _backward(s, n_stages, k)
        for mb in reversed(range(n_micro - warmup, n_micro)):  # should be oldest first
            program += _backward(s, n_stages, mb)
        schedule.append(program)
    return schedule
