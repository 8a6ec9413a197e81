"""Known-wrong: the cool-down runs the remaining backwards newest first. The next stage sends
their gradients oldest first, so the channel hands this stage the wrong micro-batch's gradient."""
from tp_from_scratch.parallelisms.schedules import backward_actions, check_sizes, forward_actions


def one_f_one_b(n_stages, n_micro):
    check_sizes(n_stages, n_micro)
    p, schedule = n_stages, []
    for s in range(p):
        warmup = min(p - 1 - s, n_micro)
        program = [a for mb in range(warmup) for a in forward_actions(s, p, mb)]
        for k in range(n_micro - warmup):
            program += forward_actions(s, p, warmup + k) + backward_actions(s, p, k)
        for mb in reversed(range(n_micro - warmup, n_micro)):  # should be oldest first
            program += backward_actions(s, p, mb)
        schedule.append(program)
    return schedule
