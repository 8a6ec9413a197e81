"""Known-right: the library's tp_block and account, but the checks run in another order than the
library's: fewer FFN columns than ranks first, then n_kv_heads, then the rest (config.validate).
The docstring gives no order, so a t that fails several checks must be accepted whichever it names."""
from tp_from_scratch.gpt.step import all_reduces_of_a_step as _library
from tp_from_scratch.gpt.step import tp_block  # noqa: F401


def all_reduces_of_a_step(config, batch_size, t, rank, itemsize=4):
    if t >= 1:
        if t > config.ffn:
            raise ValueError(f"ffn = {config.ffn} columns cannot give each of t = {t} ranks one")
        if config.n_kv_heads % t:
            raise ValueError(f"n_kv_heads = {config.n_kv_heads} is not divisible by t = {t}")
    return _library(config, batch_size, t, rank, itemsize)
