"""Lesson 11's pipeline on real processes: one torchrun launch (pp=2 x tp=2 on 4 processes,
TP inside each stage on a native gloo group, the pipeline's messages on a TorchComm) and one
mpiexec launch (pp=2 on MPIComm), each running tp_from_scratch.parallelisms.check pipeline:
two AdamW steps per schedule at m = 4, every loss, gradient (a TP rank's shard) and final
parameter against single-device training; a mismatch raises on that rank and ends the job.
Both launches then check the ViT the same way (TP inside each stage, the pipeline across:
patch embedding on the first stage, class-token norm and classifier on the last).
m = 1 and 2 are covered on the simulator (test_pipeline.py).

The torchrun launch runs in `make test-slow` (TP_TEST_SLOW=1). In `make test`, GPipe and 1F1B
on pp=2 x tp=2 under torchrun are Lesson 11's mesh launch's (tests/test_parallelisms.py); the
ViT's pipeline stages run under mpiexec here and on the simulator (tests/test_pipeline.py), its
TP on simulated ranks (tests/test_vit.py); only the ViT with TP inside pipeline stages waits for
`make test-slow`.
"""
import pytest

from tests.slow import only_in_test_slow
from tp_from_scratch.comm.launchers import mpiexec_command, run_command, torchrun_command


@pytest.mark.slow
@pytest.mark.timeout(200)
@only_in_test_slow("4 processes, held in make test by tests/test_parallelisms.py's launch")
def test_pipeline_with_tensor_parallel_stages_equals_one_device_under_torchrun():
    cmd = torchrun_command(4, "tp_from_scratch.parallelisms.check", "pipeline", "--tp", 2, "--micro", 4)
    result = run_command(cmd, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    for schedule in ("gpipe", "1f1b"):
        assert f"pp=2 tp=2 {schedule} m=4: 2 steps equal to one device" in result.stdout, result.stdout[-3000:]
        assert f"pp=2 tp=2 {schedule} m=4, ViT: 2 steps equal to one device" in result.stdout, result.stdout[-3000:]
    assert "pipeline check passed on TorchComm" in result.stdout


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_pipeline_equals_one_device_under_mpiexec():
    result = run_command(mpiexec_command(2, "tp_from_scratch.parallelisms.check", "pipeline", "--micro", 4),
                         timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    for schedule in ("gpipe", "1f1b"):
        assert f"pp=2 tp=1 {schedule} m=4: 2 steps equal to one device" in result.stdout, result.stdout[-3000:]
        assert f"pp=2 tp=1 {schedule} m=4, ViT: 2 steps equal to one device" in result.stdout, result.stdout[-3000:]
    assert "pipeline check passed on MPIComm" in result.stdout
