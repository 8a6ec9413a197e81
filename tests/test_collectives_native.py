"""The from-scratch collectives under real launchers, against MPI's and torch.distributed's own.

One job per (launcher, world size) runs every collective (sum and max, integer and gaussian
data, unequal shards) and checks each in-process against numpy and the native collective;
a mismatch fails its rank and spmd_main turns that into a non-zero exit.
"""
import pytest

from tests.slow import only_in_test_slow
from tp_from_scratch.comm.launchers import mpiexec_command, run_command, subprocess_env, torchrun_command

SCRIPT = "tests.spmd_scripts.check_collectives"
# checks per rank: 2 data kinds x (all_reduce, reduce_scatter) x 2 ops + all_gather, broadcast,
# scatter, all_to_all, all_to_all_v (+ reduce x 2 ops on the root, + gather on rank 0), + point to point, see the script
BASE_CHECKS = 2 * (2 * 2 + 5) + 1


def expected_checks(rank, p):
    subgroup = 1 if p >= 4 and p % 2 == 0 else 0  # all_reduce on half of the ranks
    return BASE_CHECKS + (2 * 2 if rank == p - 1 else 0) + (2 if rank == 0 else 0) + subgroup


def run_job(command, p):
    result = run_command(command, timeout=150, env=subprocess_env(TP_TIMEOUT=30))
    assert result.returncode == 0, result.stdout[-4000:]
    for rank in range(p):
        assert f"rank {rank}: {expected_checks(rank, p)} checks passed" in result.stdout, result.stdout[-4000:]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("p", [2, 3, 4])  # MPI jobs start in about a second: odd p too
def test_collectives_match_mpi(p):
    run_job(mpiexec_command(p, SCRIPT), p)


@pytest.mark.slow
@pytest.mark.timeout(180)
# p = 4 under torchrun in make test-slow: the same collectives run at p = 3 and 4 under mpiexec above
@pytest.mark.parametrize("p", [2, pytest.param(4, marks=only_in_test_slow("4 processes under torchrun"))])
def test_collectives_match_torch_distributed(p):
    run_job(torchrun_command(p, SCRIPT), p)
