"""Llama 3's TP degree on 2 cores: t = 8, eight processes oversubscribed. Too slow for `make
test` (minutes); `make test-slow` runs it (TP_TEST_SLOW=1), and it is skipped otherwise.

The tiny configurations split 8 ways: 8 query heads over 8 ranks, 4 KV heads each replicated on
2 ranks (GQA with fewer KV heads than ranks), a vocabulary of 67 split unevenly.
"""
import pytest

from tests.slow import only_in_test_slow
from tp_from_scratch.comm.launchers import run_command, torchrun_command

pytestmark = [
    pytest.mark.slow,
    only_in_test_slow("8 processes on 2 cores take minutes"),
]


@pytest.mark.timeout(900)
def test_gpt_gpt2_and_llama_at_tp8_match_one_device_outputs_and_every_gradient():
    # gpt.check: logits, loss, every gathered gradient, one SGD step, the state-dict round trip
    result = run_command(torchrun_command(8, "tp_from_scratch.gpt.check", "--dtype", "float64"), timeout=850)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "model checks passed" in result.stdout, result.stdout[-4000:]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_50_training_steps_at_tp8_equal_one_device(arch):
    result = run_command(torchrun_command(
        8, "tp_from_scratch.gpt.train", "--tp", "8", "--arch", arch, "--heads", "8", "--kv-heads", "4",
        "--hidden", "64", "--ffn", "128", "--steps", "50", "--dtype", "float64", "--compare-single",
        "--no-progress"), timeout=850)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "single-device comparison: 50 of 50 steps equal" in result.stdout, result.stdout[-4000:]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_lesson13_numerics_at_tp8_equal_t1_bit_for_bit(launcher):
    # tests/spmd_scripts/numerics.py: the fixed tree, the invariant layers and GPT at t = 8 and 2
    from tp_from_scratch.comm.launchers import mpiexec_command
    command = (mpiexec_command if launcher == "mpiexec" else torchrun_command)(8, "tests.spmd_scripts.numerics")
    result = run_command(command, timeout=850)
    assert result.returncode == 0, result.stdout[-4000:]
    assert result.stdout.count("numerics checks passed at t=8") == 8, result.stdout[-4000:]
