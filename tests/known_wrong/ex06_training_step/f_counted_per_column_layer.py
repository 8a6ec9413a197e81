"""Known-wrong: the account gives every column-parallel layer (q, k, v, fc) its own backward f.

The block applies one f for q, k and v together, so backward makes 2 all-reduces per block,
not 4: this list counts per layer instead of per block.
"""
from tp_from_scratch.collectives import ring_all_reduce_bytes
from tp_from_scratch.gpt.step import all_reduces_of_a_step as _ledger
from tp_from_scratch.gpt.step import tp_block  # noqa: F401


def all_reduces_of_a_step(config, batch_size, t, rank, itemsize=4):
    ledger = _ledger(config, batch_size, t, rank, itemsize)
    n = batch_size * config.seq_len * config.hidden
    extra = ("backward", "k and v: their own f", n, ring_all_reduce_bytes(n, itemsize, t, rank))
    return ledger + [extra, extra] * config.n_layers  # wrong: q, k, v share one f
