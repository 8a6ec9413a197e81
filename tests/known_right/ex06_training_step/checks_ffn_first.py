"""Known-right: the library's tp_block and account, but the divisibility checks run in another
order than the library's, ffn first, then n_kv_heads, then hidden and n_heads. The docstring
gives no order, so t = 5 (which divides none of them) must be accepted when the error names ffn."""
from tp_from_scratch.gpt.step import all_reduces_of_a_step as _library
from tp_from_scratch.gpt.step import tp_block  # noqa: F401


def all_reduces_of_a_step(config, batch_size, t, rank, itemsize=4):
    if t >= 1:
        for name in ("ffn", "n_kv_heads", "hidden", "n_heads"):
            if getattr(config, name) % t:
                raise ValueError(f"{name} = {getattr(config, name)} is not divisible by t = {t}")
    return _library(config, batch_size, t, rank, itemsize)
