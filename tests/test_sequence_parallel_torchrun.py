"""Lesson 7 under torchrun: the sequence-parallel GPT trained on real processes (gloo), every
step's loss equal to the single-device loss (the trainer exits 1 when a step differs).

One launch per configuration: 2 ranks (tp=2, float32, Lesson 6's 50 steps), and 4 ranks
(tp=4, float64, selective recomputation of the attention core); and PyTorch's own DTensor
sequence-parallel plan on 2 ranks, against one device, with CommDebugMode's counts.
"""
import pytest

from tp_from_scratch.comm.launchers import run_command, torchrun_command
from tp_from_scratch.sequence_parallel import train


@pytest.mark.parametrize("argv, message", [
    (["--impl", "dtensor"], "runs --impl scratch without --save / --load"),
    (["--save", "x"], "runs --impl scratch without --save / --load"),
    (["--tp", "2", "--ffn", "33"], "ffn size 33 is not divisible by tp=2"),  # Lesson 6's checks still apply
])
def test_what_the_script_does_not_offer_is_refused_clearly(monkeypatch, capsys, argv, message):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("ranks, extra, steps", [
    (2, ["--tp", "2"], 50),
    (4, ["--tp", "4", "--dtype", "float64", "--recompute-attention"], 10),
])
def test_sequence_parallel_training_equals_single_device_under_torchrun(ranks, extra, steps):
    cmd = torchrun_command(ranks, "tp_from_scratch.sequence_parallel.train", *extra, "--steps", steps,
                           "--compare-single", "--no-progress")
    result = run_command(cmd, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    assert f"sequence parallel over tp={extra[1]}" in result.stdout
    assert f"single-device comparison: {steps} of {steps} steps equal" in result.stdout, result.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_pytorch_sequence_parallel_plan_equals_single_device_and_counts_its_collectives():
    # the DTensor plan (SequenceParallel, PrepareModuleInput/Output, RowwiseParallel to Shard(1))
    result = run_command(torchrun_command(2, "tp_from_scratch.sequence_parallel.dtensor_plan"), timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    line = next(l for l in result.stdout.splitlines() if "largest |loss - single-device loss|" in l)
    assert float(line.rsplit(" ", 1)[1]) <= 1e-12, line  # float64: near-bitwise
    forward = next(l for l in result.stdout.splitlines() if "collectives in one forward" in l)
    assert "all_gather_into_tensor" in forward and "reduce_scatter_tensor" in forward, forward
