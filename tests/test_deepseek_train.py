"""DeepSeek-V3's entry points: Lesson 6's trainer on Lesson 12's model, in the tensor-parallel and
the expert-parallel layout, every step's loss equal to one device's; greedy generation from a
save_pretrained directory equal to transformers'; and Lesson 6's entry points refusing a
deepseek_v3 model in one line that points to the course map, without naming Lesson 12. The resume on
4 processes runs in `make test-slow`."""
import json

import pytest
import torch

from tests.slow import only_in_test_slow
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
                                     rank=rank, tol=tolerance(opts.dtype, layers=opts.model.num_hidden_layers, steps=step))


STEPS = 2
EP_RUN = ["--tp", 2, "--layout", "ep", "--dtype", "float64", "--steps", STEPS, "--data", "text"]


@pytest.fixture(scope="module")
def ep_run(tmp_path_factory):
    """The command line end to end: torchrun, the mesh, --compare-single, --eval-every, --metrics,
    and --save; (its result, the directory of its metrics and checkpoint)."""
    tmp = tmp_path_factory.mktemp("ds-ep")
    result = run_command(torchrun_command(2, "tp_from_scratch.deepseek.train", *EP_RUN, "--compare-single",
                                          "--eval-every", STEPS, "--no-progress", "--metrics", tmp / "m.jsonl",
                                          "--save", tmp / "ckpt", "--timeout", 60), timeout=220)
    assert result.returncode == 0, result.stdout[-4000:]
    return result, tmp


def losses_of(metrics):
    return {r["step"]: r for r in (json.loads(line) for line in metrics.read_text().splitlines()) if "loss" in r}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_command_trains_expert_parallel_equal_to_one_device(ep_run):
    result, tmp = ep_run
    records = [json.loads(line) for line in (tmp / "m.jsonl").read_text().splitlines()]
    assert [r["equal"] for r in records if "loss" in r] == [True] * STEPS, records
    assert [r["step"] for r in records if "val_loss" in r] == [STEPS - 1]
    assert f"{STEPS} of {STEPS} steps equal" in result.stdout


# In `make test-slow`: make test holds its claims without these 4 processes: the checkpoint two
# expert-parallel ranks write, glued back, is the single-device model and optimizer, and cuts
# exactly for t = 4 in every layout (tests/test_deepseek_checkpoint.py); the trainer's resume at
# another t and layout from DCP's checkpoint, launched at t = 2 then 4, gives the uninterrupted
# run's losses (tests/test_dcp_launched.py); the model on the from-scratch collectives under
# torchrun at t = 4 (tests/test_deepseek_moe.py)
@pytest.mark.slow
@pytest.mark.timeout(240)
@only_in_test_slow("4 processes on 2 cores")
def test_its_checkpoint_resumes_on_four_ranks_in_the_tensor_parallel_layout_as_if_never_stopped(ep_run):
    # saved by 2 expert-parallel ranks, resumed by 4 tensor-parallel ones on the from-scratch ring
    # collectives: every later step's loss equals the uninterrupted single-device run's (weights
    # and AdamW's moments resharded)
    _, tmp = ep_run
    steps = STEPS + 2
    result = run_command(torchrun_command(4, "tp_from_scratch.deepseek.train", "--tp", 4, "--layout", "tp",
                                          "--dtype", "float64", "--steps", steps, "--data", "text",
                                          "--load", tmp / "ckpt", "--collectives", "scratch", "--no-progress", "--metrics",
                                          tmp / "resumed.jsonl", "--timeout", 60), timeout=220)
    assert result.returncode == 0, result.stdout[-4000:]
    assert f"resumed: {tmp / 'ckpt'} (step {STEPS}, saved at tp=2), on to step {steps}" in result.stdout, result.stdout
    resumed = losses_of(tmp / "resumed.jsonl")
    assert sorted(resumed) == list(range(STEPS, steps))
    expected = ds_train.single_device_losses([*EP_RUN, "--steps", steps])   # the last --steps counts
    for step, record in resumed.items():
        assert_matches_reference(torch.tensor(record["loss"], dtype=torch.float64), expected[step],
                                 name=f"resumed loss at step {step}", tol=tolerance("float64", layers=2, steps=step))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_its_checkpoint_generates_on_two_ranks_as_transformers_after_export(ep_run, tmp_path):
    # TP generation from the command line at t = 2, every expert split (etp): the same ids as one
    # device, and as transformers' greedy generate on the exported save_pretrained directory
    from transformers import DeepseekV3ForCausalLM
    from tests.hf_models import float64_deepseek
    from tp_from_scratch.deepseek import convert
    _, tmp = ep_run
    prompt, n = [72, 101, 108], 6
    result = run_command(torchrun_command(2, "tp_from_scratch.deepseek.generate", "--load", tmp / "ckpt",
                                          "--layout", "etp", "--dtype", "float64", "--prompt",
                                          ",".join(map(str, prompt)), "--new-tokens", n, "--compare-single"),
                         timeout=200)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "single device: identical token ids" in result.stdout
    printed = next(line for line in result.stdout.splitlines() if "greedy:" in line).rsplit(": ", 1)[1]
    convert.main(["export", str(tmp / "ckpt"), "--out", str(tmp_path / "hf")])
    hf = DeepseekV3ForCausalLM.from_pretrained(tmp_path / "hf", experts_implementation="eager")
    hf = float64_deepseek(hf.to(torch.float64).eval())
    expected = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    assert printed == ",".join(map(str, expected[0].tolist()))


@pytest.mark.parametrize("argv, world, message", [
    (["--load", "nowhere"], 2, "no checkpoint at nowhere: the path does not exist"),
    (["--impl", "dtensor"], 1, "deepseek_v3 trains with --impl scratch only"),
    (["--tp", 3], 3, "num_attention_heads"),
    (["--tp", 2, "--layout", "ep", "--batch-size", 3], 2, "batch size 3 is not divisible by 2"),
    (["--tp", 2, "--experts", 5, "--layout", "ep", "--batch-size", 2], 2, "n_routed_experts (for expert parallelism) 5 is not divisible by tp=2"),
])
def test_what_the_deepseek_trainer_cannot_do_is_refused_before_any_work(argv, world, message):
    assert message in (ds_train.validate(ds_train.parse(argv), world) or "")


COURSE_MAP = "another model is trained and planned by its own lesson's entry point (see README.md, The course)"


@pytest.mark.parametrize("lesson", ["gpt", "sequence_parallel", "partial_sync", "parallelisms"])
def test_lesson_6_trainers_list_their_own_architectures_and_point_to_the_course_map(capsys, lesson):
    import importlib
    train = importlib.import_module(f"tp_from_scratch.{lesson}.train")
    with pytest.raises(SystemExit) as exit_:
        train.main(["--arch", "deepseek_v3"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --arch: 'deepseek_v3' is not one of gpt, gpt2, llama" in err and COURSE_MAP in err


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


def test_lesson_6_generate_and_convert_point_to_the_course_map_for_a_deepseek_directory(hf_directory, capsys):
    from tp_from_scratch.gpt import convert, generate
    _, directory = hf_directory
    refusal = "model_type 'deepseek_v3': only 'gpt2' and 'llama' checkpoints are supported here"
    with pytest.raises(SystemExit) as exit_:
        generate.main(["--hf", str(directory), "--prompt", "1,2"])
    assert exit_.value.code == 1
    assert refusal in capsys.readouterr().err
    with pytest.raises(convert.ConversionError, match=f"{refusal}.*see README.md, The course"):
        convert.load_hf(directory)
