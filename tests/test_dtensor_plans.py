"""PyTorch's DTensor plans, derived from each architecture's sharding plan (gpt.arch.PLANS), against
one device: tensor parallelism (gpt.dtensor_plan) and tensor + sequence parallelism
(sequence_parallel.dtensor_plan), the vocabulary replicated or sharded, for gpt2 and llama
(RMSNorm, RoPE, SwiGLU's gate/up/down). One torchrun launch of tests/spmd_scripts/dtensor_plans.py
compares every loss and every gradient with the single-device GPT under the tolerance policy.
(gpt's own plan is gpt2's; tests/test_plan_dtensor.py and Lesson 7's tests run it.)
"""
import pytest

from tp_from_scratch.comm.launchers import run_command, torchrun_command


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_dtensor_tp_and_sp_plans_of_gpt2_and_llama_equal_single_device():
    # both DTensor plans are derived from each architecture's sharding plan (gpt.arch.PLANS);
    # the script compares every loss and every gradient with one device, rank by rank
    result = run_command(torchrun_command(2, "tests.spmd_scripts.dtensor_plans"), timeout=120)
    assert result.returncode == 0, result.stdout[-4000:]
    checks = [line for line in result.stdout.splitlines() if line.startswith("check ")]
    assert checks == [f"check {plan} {arch}: ok" for arch in ("gpt2", "llama")
                      for plan in ("tp", "tp+vocab", "sp", "sp+vocab")], result.stdout[-4000:]
