"""Exercise 11: the 1F1B pipeline schedule, as each stage's ordered list of actions
(lessons/11_parallelisms.ipynb).

Replace the `raise NotImplementedError(...)` with your code, then run
    make grade            (or: .venv/bin/python -m pytest exercises -m ex11 -x)

A pipeline of p stages trains on m micro-batches. A schedule is a list with one program per
stage (stage 0 first); a program is a list of Action(op, mb), run top to bottom:

    Action("recv_act", i)    receive micro-batch i's activations from stage s-1 (not on stage 0)
    Action("forward", i)     compute this stage's layers on micro-batch i
    Action("send_act", i)    send micro-batch i's output to stage s+1 (not on the last stage)
    Action("recv_grad", i)   receive the gradient of that output from stage s+1 (not on the last)
    Action("backward", i)    backpropagate micro-batch i through this stage
    Action("send_grad", i)   send the gradient of micro-batch i's input to stage s-1 (not on 0)

Sends return at once; receives wait for the matching send. 1F1B ("one forward, one
backward"): stage s first runs a warm-up of forwards, as many as there are stages after it
(never more than m); then, while forwards remain, one forward followed by one backward
(the oldest micro-batch still waiting for its backward); then the remaining backwards.
So stage s never holds more than min(p - s, m) micro-batches' activations, where GPipe
(all forwards, then all backwards) holds m.

What the graders check, for p = 1..5 and m = 1..8 (odd p, m < p and m = 1 included):
every action of every micro-batch exactly once, in a valid order; each send matched by the
neighbour's receive of the same micro-batch in the same order; no deadlock; stage s's
computations in the 1F1B order, with at most min(p - s, m) micro-batches in flight; the
bubble of an ideal clock equal to (p-1)/(m+p-1); a new list on every call; ValueError for
p < 1 or m < 1. Then your schedule runs the real pipeline, which must train the GPT exactly
as one device does.
"""
from tp_from_scratch.parallelisms.schedules import Action  # noqa: F401  (op, mb), a named tuple


def one_f_one_b(n_stages, n_micro):
    """The 1F1B schedule: a list of n_stages programs, each a list of Action(op, mb).

    Raises ValueError("n_stages must be at least 1, got ...") for n_stages < 1 and
    ValueError("n_micro must be at least 1, got ...") for n_micro < 1.
    """
    raise NotImplementedError("Exercise 11 (one_f_one_b): see lessons/11_parallelisms.ipynb")
