"""Known-wrong: no warm-up: every stage alternates one forward and one backward from the
start. Valid and deadlock-free, but a stage waits for each micro-batch to come back before
starting the next: one micro-batch in flight, and a bubble far above (p-1)/(m+p-1)."""
from tp_from_scratch.parallelisms.schedules import Action


def one_f_one_b(n_stages, n_micro):
    if n_stages < 1:
        raise ValueError(f"n_stages must be at least 1, got {n_stages}")
    if n_micro < 1:
        raise ValueError(f"n_micro must be at least 1, got {n_micro}")
    schedule = []
    for s in range(n_stages):
        program = []
        for mb in range(n_micro):
            if s > 0:
                program.append(Action("recv_act", mb))
            program.append(Action("forward", mb))
            if s < n_stages - 1:
                program += [Action("send_act", mb), Action("recv_grad", mb)]
            program.append(Action("backward", mb))
            if s > 0:
                program.append(Action("send_grad", mb))
        schedule.append(program)
    return schedule
