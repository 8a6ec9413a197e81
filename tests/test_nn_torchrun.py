"""The tp_from_scratch.nn layer checks on real processes: torchrun with 2 ranks (gloo), and 4 in
`make test-slow`.

One launched job runs every check of tp_from_scratch.nn.check: with PyTorch's native collectives
and with the from-scratch ones (through TorchComm), on the world group (and, at 4 ranks, on
sub-groups of 2), after checking that the two collective implementations agree bit for bit.
At 4 ranks the job is Lesson 5's printed command; in `make test` the layers at t = 1..4 run on
simulated ranks (tests/test_nn_*.py), and on sub-groups of 2 of 4 processes under torchrun in
the dp = 2 x tp = 2 trainings (tests/test_train.py, test_parallelisms.py, test_numerics_clip.py),
each step equal to one device.
"""
import re

import pytest

from tests.slow import only_in_test_slow
from tp_from_scratch.comm.launchers import run_command, torchrun_command


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("nproc", [2, pytest.param(4, marks=only_in_test_slow("4 processes under torchrun"))])
def test_every_layer_check_passes_under_torchrun(nproc):
    result = run_command(torchrun_command(nproc, "tp_from_scratch.nn.check", "--timeout", 90), timeout=240)
    # ranks print concurrently into one pipe: find each rank's verdict, not each line
    passed = re.findall(r"rank (\d+): all checks passed: ([^\n]*?)(?=rank \d+: |\n|$)", result.stdout)
    # the ranks' own error lines first: torchrun's summary that follows them is long
    errors = [line for line in result.stdout.splitlines() if "Error:" in line or " failed:" in line]
    ranks = sorted(int(rank) for rank, _ in passed)
    assert result.returncode == 0 and ranks == list(range(nproc)), \
        "\n".join(errors[:20]) + "\n" + result.stdout[-2000:]
    assert all("native equals scratch" in verdict and "default init equals nn.Linear" in verdict
               and "scratch, world group" in verdict and (nproc < 4 or "scratch, sub-group of 2" in verdict)
               for _, verdict in passed), passed
