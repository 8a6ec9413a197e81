"""Known-wrong: a warm-up of p - s forwards instead of p - 1 - s: correct gradients, but
every stage holds one micro-batch more than 1F1B needs (the last stage two forwards ahead)."""
from tp_from_scratch.parallelisms.schedules import backward_actions, check_sizes, forward_actions


def one_f_one_b(n_stages, n_micro):
    check_sizes(n_stages, n_micro)
    p, schedule = n_stages, []
    for s in range(p):
        warmup = min(p - s, n_micro)  # should be p - 1 - s
        program = [a for mb in range(warmup) for a in forward_actions(s, p, mb)]
        for k in range(n_micro - warmup):
            program += forward_actions(s, p, warmup + k) + backward_actions(s, p, k)
        for mb in range(n_micro - warmup, n_micro):
            program += backward_actions(s, p, mb)
        schedule.append(program)
    return schedule
