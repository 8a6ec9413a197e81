"""Lesson 7 under torchrun: the sequence-parallel GPT trained on real processes (gloo), every
step's loss equal to the single-device loss (the trainer exits 1 when a step differs).

The trainer's command line as a user types it (tp=2, float32, 20 steps, every shared option) is
launched by tests/test_trainer_options.py, the tp=4 and dp=2 x tp=2 runs by tests/test_sp_training_torchrun.py;
here PyTorch's own DTensor sequence-parallel plan on 2 ranks, against one device, its collectives counted next to
ours, the counts equal to the committed measurement the lesson shows; in the same launch, both
DTensor plans of gpt2 and llama against one device. (tp=4 and dp=2 x tp=2,
DTensor in the trainer and the checkpoint round trip: tests/test_sp_training_torchrun.py.)
"""
import json
import re
from pathlib import Path

import pytest

from tp_from_scratch.comm.launchers import run_command, torchrun_command
from tp_from_scratch.compare import tolerance
from tp_from_scratch.sequence_parallel import train


@pytest.mark.parametrize("argv, message", [
    (["--impl", "dtensor", "--recompute-attention"], "--recompute-attention is ours"),
    (["--impl", "dtensor", "--tp", "2", "--kv-heads", "1"], "--impl dtensor needs the KV heads (n_kv_heads, --kv-heads) divisible by tp"),
    (["--impl", "dtensor", "--save", "x"], "--save and --load work with --impl scratch only"),
    (["--tp", "2", "--ffn", "1"], "tp=2 is larger than ffn size 1"),  # Lesson 6's checks still apply
])
def test_what_the_script_does_not_offer_is_refused_clearly(monkeypatch, capsys, argv, message):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_pytorch_sequence_parallel_plan_equals_single_device_and_counts_its_collectives(tmp_path):
    # the DTensor plan (SequenceParallel, PrepareModuleInput/Output, RowwiseParallel to Shard(1)).
    # The same launch first checks both DTensor plans (TP and SP, vocabulary replicated or sharded)
    # of gpt2 and llama, derived from each architecture's sharding plan (gpt.arch.PLANS): every
    # loss and every gradient against one device (tests/spmd_scripts/dtensor_plans.py)
    out = tmp_path / "counts.json"
    result = run_command(torchrun_command(2, "tests.spmd_scripts.dtensor_plans", "--write", out), timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    checks = [line for line in result.stdout.splitlines() if line.startswith("check ")]
    assert checks == [f"check {plan} {arch}: ok" for arch in ("gpt2", "llama")
                      for plan in ("tp", "tp+vocab", "sp", "sp+vocab")], result.stdout[-4000:]
    counts = json.loads(out.read_text())
    layers = counts["config"]["layers"]
    # the largest loss difference over the run's float64 steps, under the policy's bound for its
    # last step (scale 1: the losses are above 1, so this is the stricter side of max(1, |loss|))
    for marker in ("largest |loss - single-device loss|", "loss_parallel, tp=2: largest"):
        line = next(l for l in result.stdout.splitlines() if marker in l)
        steps = int(re.search(r"over (\d+) float64 steps", line).group(1))
        assert float(line.rsplit(" ", 1)[1]) <= tolerance("float64", layers=layers, steps=steps - 1), line
    # ours: per block 2 all-gathers (q/k/v share one) + 2 reduce-scatters forward, one more
    # gather per column group in backward; DTensor's all-gathers and reduce-scatters are there too
    assert counts["ours"]["forward"]["all-gather"] == 2 * layers + 1  # + the gather before the LM head
    assert counts["ours"]["forward"]["reduce-scatter"] == 2 * layers
    assert counts["dtensor"]["forward"]["all-gather"] >= 2 * layers
    assert counts["dtensor"]["forward"]["reduce-scatter"] == 2 * layers
    # the lesson reads the committed file: it must be what the command gives today
    committed = Path(__file__).parents[1] / "lessons" / "measurements" / "sp_collectives.json"
    assert json.loads(committed.read_text()) == counts, "rerun: " + counts["command"]
