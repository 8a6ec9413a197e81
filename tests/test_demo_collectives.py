"""The collectives demo runs end to end under mpiexec and torchrun, and says every result is equal.

The demo checks each from-scratch collective against the native one and numpy on every
rank (a mismatch raises there and spmd_main ends the job non-zero); these tests launch it
with small arrays and read its report.
"""
import re

import pytest

from tests.slow import only_in_test_slow
from tp_from_scratch.comm.launchers import mpiexec_command, run_command, torchrun_command

MODULE = "tp_from_scratch.demos.collectives"
COLLECTIVES = ["all_reduce(sum)", "all_reduce(max)", "reduce_scatter", "reduce_scatter (uneven)",
               "all_gather", "all_gather (uneven)", "broadcast", "reduce", "scatter", "gather", "all_to_all"]


def assert_demo_succeeded(out, native):
    assert f"native: {native}" in out, out[-3000:]
    for name in COLLECTIVES:
        # rank 0's row: equal to native (or '-' where native needs even shards) and to numpy,
        # or checked on the root rank for rooted results
        row = re.search(rf"^{re.escape(name)}\s+\S.*?\s(equal|-|on rank \d)\s+(equal|on rank \d)$", out, re.M)
        assert row, f"no verdict row for {name}:\n{out[-3000:]}"
    # the meter's table, and the all_reduce traffic equal to the ring's formula
    assert re.search(r"^all_reduce\s+2\s+", out, re.M), out[-3000:]
    sent, formula = re.search(r"rank 0 sent (\d+) bytes; the ring's .* = (\d+)", out).groups()
    assert sent == formula, out[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_demo_under_mpiexec_4_ranks():
    result = run_command(mpiexec_command(4, MODULE, "--rows", "8"), timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    assert_demo_succeeded(result.stdout, "MPI")


@pytest.mark.slow
@pytest.mark.timeout(200)
# the demo runs under mpiexec (4 ranks) above; the same collectives against torch.distributed's
# under torchrun: tests/test_collectives_native.py
@only_in_test_slow("the demo under a second launcher")
def test_demo_under_torchrun_2_ranks():   # 4 ranks under mpiexec above
    result = run_command(torchrun_command(2, MODULE, "--rows", "8"), timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    assert_demo_succeeded(result.stdout, "torch.distributed (gloo)")
