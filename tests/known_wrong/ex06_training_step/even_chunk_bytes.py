"""Known-wrong: bytes sent as 2 (t-1)/t of the payload, rounded down, on every rank.

Right when t divides the elements (every activation here); wrong for the loss's three
all-reduces of B*T numbers when t does not divide B*T: the ranks then send different amounts.
"""
from tp_from_scratch.gpt.step import all_reduces_of_a_step as _ledger
from tp_from_scratch.gpt.step import tp_block  # noqa: F401


def all_reduces_of_a_step(config, batch_size, t, rank, itemsize=4):
    return [(phase, where, n, itemsize * 2 * (t - 1) * n // t)  # wrong: chunks assumed equal
            for phase, where, n, _ in _ledger(config, batch_size, t, rank, itemsize)]
