"""Known-wrong: send_grad comes before the backward that computes the gradient it sends."""
from tp_from_scratch.parallelisms import schedules


def one_f_one_b(n_stages, n_micro):
    fixed = schedules.one_f_one_b(n_stages, n_micro)
    for program in fixed:  # move each send_grad in front of its backward
        for i, action in enumerate(program):
            if action.op == "send_grad":
                program[i - 1], program[i] = action, program[i - 1]
    return fixed
