"""Known-right: the library's tp_block and account, but the errors name the TP degree by the
stub's own name, t ("t = 0 must be at least 1"), not "tp". The graders must accept it."""
from tp_from_scratch.gpt.step import all_reduces_of_a_step as _library
from tp_from_scratch.gpt.step import tp_block  # noqa: F401


def all_reduces_of_a_step(config, batch_size, t, rank, itemsize=4):
    if t < 1:
        raise ValueError(f"t = {t} must be at least 1")
    return _library(config, batch_size, t, rank, itemsize)
