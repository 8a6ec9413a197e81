"""DeepSeek-V3's entry points (issue 27 item 4): Lesson 6's trainer on Lesson 12's model, in the
tensor-parallel and the expert-parallel layout, every step's loss equal to one device's; greedy
generation from a save_pretrained directory equal to transformers'; and Lesson 6's entry points
refusing a deepseek_v3 model in one line that names Lesson 12's command."""
import json

import pytest
import torch

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.comm.launchers import run_command, torchrun_command
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.deepseek import train as ds_train


@pytest.mark.parametrize("layout", ["tp", "ep"])
def test_training_on_two_simulated_ranks_equals_one_device_at_every_step(layout):
    # the trainer's own model, data, optimizer and step on run_spmd's ranks; float64 on text
    argv = ["--tp", 2, "--layout", layout, "--dtype", "float64", "--steps", 3, "--data", "text", "--batch-size", 4]
    opts = ds_train.parse(argv)
    expected = ds_train.single_device_losses(argv)
    for rank, losses in enumerate(run_spmd(lambda comm: ds_train.train_on_comm(comm, argv), 2)):
        assert len(losses) == len(expected)
        for step, (loss, ref) in enumerate(zip(losses, expected)):
            assert_matches_reference(torch.tensor(loss, dtype=torch.float64), ref, name=f"{layout} loss at step {step}",
                                     rank=rank, tol=tolerance(opts.dtype, layers=opts.layers, steps=step))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_command_trains_expert_parallel_equal_to_one_device(tmp_path):
    # the command line end to end: torchrun, the mesh, --compare-single, --eval-every, --metrics
    steps = 2
    result = run_command(torchrun_command(2, "tp_from_scratch.deepseek.train", "--tp", 2, "--layout", "ep",
                                          "--dtype", "float64", "--steps", steps, "--compare-single",
                                          "--data", "text", "--eval-every", steps, "--no-progress",
                                          "--metrics", tmp_path / "m.jsonl", "--timeout", 60), timeout=220)
    assert result.returncode == 0, result.stdout[-4000:]
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["equal"] for r in records if "loss" in r] == [True] * steps, records
    assert [r["step"] for r in records if "val_loss" in r] == [steps - 1]
    assert f"{steps} of {steps} steps equal" in result.stdout


@pytest.mark.parametrize("argv, world, message", [
    (["--save", "x"], 2, "--save and --load are not supported for deepseek_v3"),
    (["--tp", 3], 3, "num_attention_heads"),
    (["--tp", 2, "--layout", "ep", "--batch-size", 3], 2, "batch size 3 is not divisible by 2"),
    (["--tp", 2, "--experts", 5, "--layout", "ep", "--batch-size", 2], 2, "--experts"),
])
def test_what_the_deepseek_trainer_cannot_do_is_refused_before_any_work(argv, world, message):
    assert message in (ds_train.validate(ds_train.parse(argv), world) or "")


@pytest.mark.parametrize("lesson", ["gpt", "sequence_parallel", "partial_sync", "parallelisms"])
def test_lesson_6_trainers_point_at_lesson_12_for_deepseek(capsys, lesson):
    import importlib
    train = importlib.import_module(f"tp_from_scratch.{lesson}.train")
    with pytest.raises(SystemExit) as exit_:
        train.main(["--arch", "deepseek_v3"])
    assert exit_.value.code == 2
    assert "error: --arch deepseek_v3 is Lesson 12's model: run" in capsys.readouterr().err


@pytest.fixture(scope="module")
def hf_directory(tmp_path_factory):
    from tests.hf_models import deepseek_v3
    hf = deepseek_v3(seed=5, patch=False)
    directory = tmp_path_factory.mktemp("deepseek") / "hf"
    hf.save_pretrained(directory)
    return hf, directory


def test_generate_command_equals_transformers_greedy_generate(hf_directory, capsys):
    from tp_from_scratch.deepseek import generate
    hf, directory = hf_directory
    prompt, n = [4, 9, 2], 6
    expected = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    with pytest.raises(SystemExit) as exit_:
        generate.main(["--hf", str(directory), "--prompt", ",".join(map(str, prompt)), "--new-tokens", str(n),
                       "--dtype", "float64"])
    assert exit_.value.code == 0
    printed = capsys.readouterr().out.strip().rsplit(": ", 1)[1]
    assert printed == ",".join(map(str, expected[0].tolist()))


def test_lesson_6_generate_and_convert_point_at_lesson_12_for_a_deepseek_directory(hf_directory, capsys, tmp_path):
    from tp_from_scratch.gpt import convert, generate
    _, directory = hf_directory
    with pytest.raises(SystemExit) as exit_:
        generate.main(["--hf", str(directory), "--prompt", "1,2"])
    assert exit_.value.code == 1
    assert "model_type 'deepseek_v3' is Lesson 12's model: run" in capsys.readouterr().err
    with pytest.raises(convert.ConversionError, match="Lesson 12's model: run .*deepseek.generate"):
        convert.load_hf(directory)
