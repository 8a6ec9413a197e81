"""The transformer-block demo runs end to end: under mpiexec, torchrun and the simulator.

It must report every tensor matching the reference, 1/t of the split weights per rank,
and measured all-reduce bytes equal to the theory; bad sizes must end the job with the
quantity named.
"""
import re

import pytest

from tests.slow import only_in_test_slow
from tp_from_scratch.demos import transformer_block
from tp_from_scratch.comm.launchers import mpiexec_command, run_command, torchrun_command

MODULE = "tp_from_scratch.demos.transformer_block"


def assert_demo_succeeded(out, ranks):
    # output, grad of x and the 15 parameter gradients (no key bias, as in the torch GPT)
    assert "17/17 tensors match on rank 0; all ranks" in out, out
    assert "MISMATCH" not in out
    theory, measured = re.search(r"= (\d+) bytes sent per rank; measured (\d+)", out).groups()
    assert theory == measured, out
    split = re.search(r"(\d+) = (\d+) / (\d+) on each rank", out).groups()
    assert int(split[0]) * ranks == int(split[1]) and int(split[2]) == ranks, out


def test_demo_on_simulated_ranks_with_copied_kv_heads(capsys):
    transformer_block.main(["--simulate", "4", "--kv-heads", "2", "--dtype", "float32"])
    out = capsys.readouterr().out
    assert_demo_succeeded(out, 4)
    assert "each KV head is stored on t/nkv = 2 ranks" in out


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_demo_under_mpiexec_4_ranks():
    result = run_command(mpiexec_command(4, MODULE), timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    assert_demo_succeeded(result.stdout, 4)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_demo_under_mpiexec_names_a_size_tp_does_not_divide():
    # 6 heads cannot be split over 4 ranks: the job must end quickly, non-zero, saying so
    result = run_command(mpiexec_command(4, MODULE, "--heads", "6", "--kv-heads", "2", "--hidden", "12"),
                         timeout=120)
    assert result.returncode != 0
    assert "number of heads 6 is not divisible by tp=4" in result.stdout
    assert re.search(r"rank \d failed", result.stdout), result.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(200)
# the demo runs under mpiexec (4 ranks) and on simulated ranks above; torchrun's collectives are
# proven in make test by tests/test_collectives_native.py
@only_in_test_slow("the demo under a second launcher")
def test_demo_under_torchrun_2_ranks():
    result = run_command(torchrun_command(2, MODULE, "--kv-heads", "1"), timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    assert_demo_succeeded(result.stdout, 2)
