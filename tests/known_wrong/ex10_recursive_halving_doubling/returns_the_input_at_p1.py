"""Known-wrong: at p = 1 there is nothing to add, so it returns x itself. A caller who then
writes into the result changes its own input (the library returns a new array at every p)."""
from tp_from_scratch.overlap.algorithms import all_reduce_rabenseifner as _library


def all_reduce_rabenseifner(comm, x, op="sum"):
    if comm.world_size == 1:
        return x
    return _library(comm, x, op)
