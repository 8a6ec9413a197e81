"""Known-wrong: in the steady state the forward's activation is sent only after the backward
that follows it (a send placed too late). Every action is there, in a valid order, with the
1F1B computations; but the next stage waits for a whole backward before it can start, and
the bubble grows above (p-1)/(m+p-1)."""
from tp_from_scratch.parallelisms.schedules import Action, backward_actions, check_sizes, forward_actions


def one_f_one_b(n_stages, n_micro):
    check_sizes(n_stages, n_micro)
    schedule = []
    for s in range(n_stages):
        warmup = min(n_stages - 1 - s, n_micro)
        program = [a for mb in range(warmup) for a in forward_actions(s, n_stages, mb)]
        for k in range(n_micro - warmup):
            forward = forward_actions(s, n_stages, warmup + k)
            late = [a for a in forward if a.op == "send_act"]
            program += [a for a in forward if a.op != "send_act"] + backward_actions(s, n_stages, k) + late
        for mb in range(n_micro - warmup, n_micro):
            program += backward_actions(s, n_stages, mb)
        schedule.append(program)
    assert all(isinstance(a, Action) for program in schedule for a in program)
    return schedule
