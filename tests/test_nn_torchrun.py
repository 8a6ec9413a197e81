"""The tp_from_scratch.nn layer checks on real processes: torchrun with 2 and 4 ranks (gloo).

One launched job per world size runs every check of tp_from_scratch.nn.check: with PyTorch's
native collectives and with the from-scratch ones (through TorchComm), on the world group and
on sub-groups of 2, after checking that the two collective implementations agree bit for bit.
"""
import re

import pytest

from tp_from_scratch.comm.launchers import run_command, torchrun_command


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("nproc", [4])  # t = 1..4 on simulated ranks in tests/test_nn_*.py
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
               and "scratch, world group" in verdict for _, verdict in passed), passed
