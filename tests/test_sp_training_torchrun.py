"""Lesson 7's trainer on 4 real processes (gloo), ONE launch for every mesh, everything checked inside
it (tests/spmd_scripts/sp_training.py prints one "check ...: ok" line per run and exits 1 on a
difference):

- tp=4, one block: ours with selective recomputation, STEPS float32 steps, and PyTorch's DTensor
  sequence-parallel plan through the trainer (--impl dtensor), float64, each step against one device;
- dp=2 x tp=2: ours STEPS float64 steps (near-bitwise) saved WITH sequence parallelism, loaded by
  Lesson 6's trainer WITHOUT it at tp=4, saved again, loaded with it at tp=2: all STEPS + 10 steps
  equal to one uninterrupted single-device run; then the DTensor plan in float32 with data parallelism.

STEPS is 10 in `make test` (as tests/test_train.py's launch) and 50 in `make test-slow`
(TP_TEST_SLOW=1): every claim holds from the first step on; the longer run is there to see
roundoff stay within the policy's growth over more steps.
"""
import pytest

from tests.slow import SLOW
from tp_from_scratch.comm.launchers import run_command, torchrun_command

SCRIPT = "tests.spmd_scripts.sp_training"
STEPS = 50 if SLOW else 10


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    """The "check ..." lines of the one launch (the meshes tp=4 and dp=2 x tp=2), and its directory."""
    tmp = tmp_path_factory.mktemp("sp")
    result = run_command(torchrun_command(4, SCRIPT, "--checkpoint", tmp, "--steps", STEPS), timeout=540)
    assert result.returncode == 0, result.stdout[-4000:]
    return [line for line in result.stdout.splitlines() if line.startswith("check ")], tmp


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tp4_ours_and_dtensor_plan_equal_single_device(checks):
    lines, _ = checks
    assert lines[:2] == [f"check float32 ours (recomputed attention), {STEPS} steps: ok",
                         "check float64 dtensor, 5 steps: ok"], lines


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dp2_tp2_steps_and_checkpoint_with_and_without_sequence_parallelism(checks):
    lines, tmp = checks
    assert lines[2:] == ["check float64 sp tp=2 saves: ok",
                         "check float64 no sp tp=4 loads: ok",
                         "check float64 sp tp=2 loads: ok",
                         "check checkpoint chain against one uninterrupted single-device run: ok",
                         "check float32 dtensor dp=2 x tp=2, 5 steps: ok"], lines
    assert (tmp / "sp" / "latest").exists() and (tmp / "tp" / "latest").exists()
