"""Known-wrong: the warm-up is p - 1 - s forwards even when there are fewer micro-batches
(m < p - 1 - s): the stage forwards micro-batches that do not exist."""
from tp_from_scratch.parallelisms.schedules import backward_actions, check_sizes, forward_actions


def one_f_one_b(n_stages, n_micro):
    check_sizes(n_stages, n_micro)
    p, schedule = n_stages, []
    for s in range(p):
        warmup = p - 1 - s  # should be min(p - 1 - s, n_micro)
        program = [a for mb in range(warmup) for a in forward_actions(s, p, mb)]
        for k in range(n_micro - warmup):
            program += forward_actions(s, p, warmup + k) + backward_actions(s, p, k)
        for mb in range(max(n_micro - warmup, 0), n_micro):
            program += backward_actions(s, p, mb)
        schedule.append(program)
    return schedule
