"""Lesson 10's non-blocking all-reduce and the column-parallel layer that overlaps it with dW.

On simulated ranks: all_reduce_async has collectives.all_reduce's bits and meter counts, also
with a blocking collective in flight at the same time; the overlapping layer's outputs and
gradients equal ColumnParallelLinear's bit for bit. Then one launch under torchrun (native
process group and TorchComm) and one under mpiexec (an odd world size) run the same checks
on real processes (tp_from_scratch.overlap.check).
"""
import re

import numpy as np
import pytest
import torch

from tp_from_scratch import collectives
from tp_from_scratch.comm import SPMDError, run_spmd
from tp_from_scratch.comm.launchers import mpiexec_command, run_command, torchrun_command
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.overlap.check import check_async, check_async_layer
from tp_from_scratch.overlap.linear import AsyncColumnParallelLinear, Timeline
from tp_from_scratch.overlap.nonblocking import all_reduce_async
from tp_from_scratch.testing import random_array, rank_rng


@pytest.mark.parametrize("p", range(1, 9))
def test_async_all_reduce_equals_the_blocking_one(p):
    run_spmd(check_async, p)


@pytest.mark.parametrize("op", ["max", "prod"])
def test_async_all_reduce_other_ops_and_untouched_input(op):
    xs = [random_array(rank_rng(800, r), (4, 3), np.float64, integer=True) for r in range(3)]
    originals = [x.copy() for x in xs]

    def rank_fn(comm):
        handle = all_reduce_async(comm, xs[comm.rank], op=op)
        return handle.wait(), collectives.all_reduce(comm, xs[comm.rank], op=op)
    for r, (got, blocking) in enumerate(run_spmd(rank_fn, 3)):
        assert_matches_reference(got, blocking, name=f"all_reduce_async {op}", rank=r, exact=True)
        assert_matches_reference(xs[r], originals[r], name="input after all_reduce_async", rank=r, exact=True)
        assert not np.shares_memory(got, xs[r]), f"rank {r}: the result is a view of the input"


def test_test_advances_without_waiting_and_wait_finishes():
    # cooperative progress: test() takes what has arrived and returns at once; wait() blocks
    def rank_fn(comm):
        x = np.full(6, comm.rank + 1.0)
        if comm.rank == 0:
            handle = all_reduce_async(comm, x)
            early = handle.test()  # rank 1 has not started: nothing can have arrived
            comm.barrier()
        else:
            comm.barrier()
            handle = all_reduce_async(comm, x)  # its start sends both of its messages
        comm.barrier()
        later = handle.test()
        return early if comm.rank == 0 else None, later, handle.wait()
    (early, later, result), (_, _, other) = run_spmd(rank_fn, 2)
    assert early is False and later is True, (early, later)
    for r, y in enumerate([result, other]):
        assert_matches_reference(y, np.full(6, 3.0), name="all_reduce_async after test()", rank=r, exact=True)


def test_a_second_async_all_reduce_in_flight_is_refused():
    def rank_fn(comm):
        all_reduce_async(comm, np.ones(3))
        all_reduce_async(comm, np.ones(3))
    with pytest.raises(SPMDError, match="already in flight"):
        run_spmd(rank_fn, 2)


@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_overlapping_layer_equals_the_blocking_layer(t):
    run_spmd(check_async_layer, t)
    run_spmd(lambda comm: check_async_layer(comm, dtype=torch.float32, gather_output=True), t)


def test_the_timeline_shows_dw_between_start_and_wait():
    def rank_fn(comm):
        timeline = Timeline()
        layer = AsyncColumnParallelLinear(6, 4, group=comm, timeline=timeline)
        x = torch.ones(2, 6, requires_grad=True)
        layer(x).sum().backward()
        return [name for name, _, _ in timeline.events]
    for names in run_spmd(rank_fn, 2):
        assert names == ["dX matmul", "start all-reduce", "dW, db matmul", "wait all-reduce"], names


def _passed(stdout):
    return sorted(int(r) for r in re.findall(r"rank (\d+): all \d+ overlap checks passed", stdout))


def _why(stdout):
    """The ranks' own error lines first: the launcher's summary that follows them is long."""
    errors = [line for line in stdout.splitlines()
              if any(word in line for word in ("Error", " failed", "terminate", "what()"))]
    return "\n".join(errors[:20]) + "\n" + stdout[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_overlap_checks_under_torchrun_2_ranks():
    result = run_command(torchrun_command(2, "tp_from_scratch.overlap.check"), timeout=180)
    assert result.returncode == 0 and _passed(result.stdout) == [0, 1], _why(result.stdout)
    assert "native process group" in result.stdout, result.stdout[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_overlap_checks_under_mpiexec_3_ranks():
    result = run_command(mpiexec_command(3, "tp_from_scratch.overlap.check"), timeout=180)
    assert result.returncode == 0 and _passed(result.stdout) == [0, 1, 2], _why(result.stdout)
