"""Known-wrong: with one rank, all_gather hands back x itself (nothing to gather), an alias of the input."""
from tp_from_scratch.collectives import all_gather as _all_gather
from tp_from_scratch.collectives import all_reduce, reduce_scatter  # noqa: F401


def all_gather(comm, x, axis=0):
    if comm.world_size == 1:
        return x
    return _all_gather(comm, x, axis=axis)
