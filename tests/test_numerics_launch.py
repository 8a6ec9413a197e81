"""Lesson 13 on real processes: one mpiexec and one torchrun launch of 4 ranks, at the same time.

Each runs tests/spmd_scripts/numerics.py: the fixed tree, the invariant layers and the invariant
GPT bit for bit equal to t = 1 at t = 4 and at t = 2 (MPIComm and its sub-communicators; TorchComm,
the native process group and its sub-groups); under torchrun also clip_grad_norm on a dp x tp
mesh against torch's clip_grad_norm_ on one device, and the doubling backward: torch's
differentiable all-reduces where g belongs give exactly twice the weight gradient at t = 2.
t = 8 runs in `make test-slow` (tests/test_slow_tp8.py).
"""
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from tp_from_scratch.comm.launchers import mpiexec_command, run_command, torchrun_command

SCRIPT = "tests.spmd_scripts.numerics"
NPROC = 4


def verdicts(stdout):
    """The ranks that printed 'all N numerics checks passed' (ranks print into one pipe at once)."""
    return sorted(int(r) for r in re.findall(r"rank (\d+): all \d+ numerics checks passed", stdout))


@pytest.fixture(scope="module")
def launched():
    commands = {"mpiexec": mpiexec_command(NPROC, SCRIPT), "torchrun": torchrun_command(NPROC, SCRIPT)}
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(commands, pool.map(lambda c: run_command(c, timeout=270), commands.values())))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_every_numerics_check_passes_on_real_processes(launched, launcher):
    result = launched[launcher]
    errors = [line for line in result.stdout.splitlines() if "Error" in line or " failed" in line]
    assert result.returncode == 0 and verdicts(result.stdout) == list(range(NPROC)), \
        "\n".join(errors[:20]) + "\n" + result.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchs_differentiable_all_reduce_doubles_the_weight_gradient_at_t2(launched):
    out = launched["torchrun"].stdout
    line = re.search(r"rank 0: doubling t=2: ([^\n]*)", out)
    assert line, out[-3000:]
    assert "Megatron g (reduce_from_tp_region) 1.000000 1.000000" in line.group(1)
    assert "torch.distributed.nn.functional.all_reduce 2.000000 2.000000" in line.group(1)
    assert "_functional_collectives.all_reduce 2.000000 2.000000" in line.group(1)
    # at t = 4, four identical losses: four times
    assert "torch.distributed.nn.functional.all_reduce 4.000000 4.000000" in out
