"""Known-wrong: no warm-up: every stage alternates one forward and one backward from the
start. Valid and deadlock-free, but a stage waits for each micro-batch to come back before
starting the next: one micro-batch in flight, and a bubble far above (p-1)/(m+p-1)."""
from tp_from_scratch.parallelisms.schedules import backward_actions, check_sizes, forward_actions


def one_f_one_b(n_stages, n_micro):
    check_sizes(n_stages, n_micro)
    return [[a for mb in range(n_micro) for a in forward_actions(s, n_stages, mb) + backward_actions(s, n_stages, mb)]
            for s in range(n_stages)]
