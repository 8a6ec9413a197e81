"""Every trainer entry point honours every shared option, or refuses it with a message, and gives
the same single-device verdict and exit status for --equal-steps.

The trainers are one trainer (gpt/train.py) with each later lesson's hooks, so each shared
option must act the same in all of them. One torchrun launch per trainer, 2 processes, a tiny
model, with every shared option at once; then, from its output:

    --data text      the losses are the text corpus's: they differ from a Markov run's (computed
                     here, same seed and V), and --compare-single holds them equal to the
                     single-device run on text
    --save-every N   checkpoints at N, 2N, ...; --save the last
    --plot PNG       a PNG;  --eval-every N  a validation loss line every N steps
    --equal-steps N  the report says only the first N steps must be equal
    --metrics PATH   one record per step (+ the lesson's own fields)

--no-progress is checked in-process (a bar only ever shows on a terminal); what a trainer cannot
honour is refused before any work, each message tested.
"""
import json

import pytest
import torch

from tp_from_scratch.comm.launchers import run_command, torchrun_command
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import train
from tp_from_scratch.partial_sync import train as caat_train

TINY = ["--hidden", "32", "--heads", "4", "--kv-heads", "2", "--layers", "1", "--seq-len", "16",
        "--batch-size", "4", "--timeout", "60"]
SMALL = ["--hidden", "32", "--heads", "4", "--kv-heads", "2", "--layers", "2", "--seq-len", "16",
         "--batch-size", "4", "--timeout", "60"]

# name -> (module, steps, extra flags, saves): one launch each. Lesson 7's run is also the check
# that sequence-parallel training under torchrun equals one device for 20 steps; Lesson 8's that
# 50 float64 steps at t = 2 equal the t-stream model (the test below reads both).
TRAINERS = {
    "gpt": ("tp_from_scratch.gpt.train", 4, TINY, True),
    "sequence_parallel": ("tp_from_scratch.sequence_parallel.train", 20, TINY, True),
    "partial_sync": ("tp_from_scratch.partial_sync.train", 50,
                     SMALL + ["--sync-fraction", "0.5", "--dtype", "float64"], True),
    "parallelisms": ("tp_from_scratch.parallelisms.train", 4, TINY, False),   # refuses --save
}


def every_option(tmp, steps, saves):
    every = steps // 2
    argv = ["--tp", 2, "--steps", steps, "--data", "text", "--eval-every", every, "--compare-single",
            "--equal-steps", 2, "--no-progress", "--plot", tmp / "loss.png", "--metrics", tmp / "m.jsonl"]
    return argv + (["--save", tmp / "ck", "--save-every", every] if saves else [])


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """launched(name) -> (stdout, metrics records, run directory) of that trainer, run once."""
    cache = {}

    def get(name):
        if name not in cache:
            module, steps, extra, saves = TRAINERS[name]
            tmp = tmp_path_factory.mktemp(name)
            result = run_command(torchrun_command(2, module, *every_option(tmp, steps, saves), *extra),
                                 timeout=280)
            assert result.returncode == 0, f"{name}:\n{result.stdout[-4000:]}"
            records = [json.loads(line) for line in (tmp / "m.jsonl").read_text().splitlines()]
            cache[name] = result.stdout, records, tmp
        return cache[name]

    return get


def markov_first_loss(name):
    """Step 0's single-device loss on the Markov chain with the text run's V (256) and seed."""
    _, _, extra, _ = TRAINERS[name]
    argv = ["--tp", 2, "--steps", 1, "--vocab-size", 256, *extra]
    if name == "partial_sync":
        return caat_train.t_stream_losses(argv)[0]
    return first_loss(train.parse(argv))


def first_loss(opts):
    """Step 0's loss of the single-device GPT for the settings ``opts``."""
    return next(train.single_device_run(opts.model, opts))[1]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(TRAINERS))
def test_every_shared_option_has_its_effect(launched, name):
    out, records, tmp = launched(name)
    _, steps, extra, saves = TRAINERS[name]
    losses = [r for r in records if "loss" in r]
    assert [r["step"] for r in losses] == list(range(steps))                        # --metrics
    # --data text: the trainer's loss equals one device's on text (--compare-single), and is not
    # the Markov chain's (Lesson 8's trainer once trained on the chain whatever --data said)
    assert f"comparison: {steps} of {steps} steps equal" in out, out[-3000:]
    assert abs(losses[0]["loss"] - float(markov_first_loss(name))) > 1e-3
    every = steps // 2
    evals = [r["step"] for r in records if "val_loss" in r]                          # --eval-every
    assert evals == [every - 1, steps - 1] and f"step {every - 1:4d}  validation loss" in out
    assert (tmp / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"                # --plot
    assert "only steps 0..1 must be (--equal-steps 2)" in out                        # --equal-steps
    if saves:                                                                         # --save-every
        saved = sorted(ckpt.read_metadata(d)[1]["step"] for d in (tmp / "ck").glob("step_*"))
        assert saved == [every, steps]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lesson_8_records_p_and_its_bytes_and_its_checkpoint_belongs_to_its_t_and_p(launched):
    out, records, tmp = launched("partial_sync")
    assert "TP bytes per step on rank 0" in out and "t-stream single-device comparison: 50 of 50" in out
    losses = [r for r in records if "loss" in r]
    assert all(r["sync_fraction"] == 0.5 and r["tp_bytes"] > 0 for r in losses)
    config = caat_train.parse(["--data", "text", *SMALL]).model
    meta = ckpt.load_full(tmp / "ck", config, caat_train.description(config, 2, 0.5))["meta"]
    assert meta["sync_fraction"] == 0.5 and meta["tp"] == 2
    with pytest.raises(ckpt.CheckpointError, match="--sync-fraction 0.5 at --tp 2"):
        ckpt.load_full(tmp / "ck", config, caat_train.description(config, 4, 0.5))


def test_lesson_8_without_a_launcher_trains_on_text(tmp_path, monkeypatch):
    # at p = 1, t = 1 the CAAT model IS the GPT: its first loss on text is the GPT's on text
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    run = ["--steps", 1, "--seed", 3, *TINY]
    with pytest.raises(SystemExit) as exit_info:
        caat_train.main([str(a) for a in ["--tp", 1, "--data", "text", *run, "--metrics", tmp_path / "m.jsonl"]])
    assert exit_info.value.code == 0
    got = json.loads((tmp_path / "m.jsonl").read_text().splitlines()[0])["loss"]
    text = first_loss(train.parse(["--data", "text", *run]))
    layers = train.parse(["--data", "text", *run]).model.n_layers
    assert_matches_reference(torch.tensor(got, dtype=torch.float32), text, name="loss at step 0",
                             tol=tolerance("float32", layers=layers))
    markov = first_loss(train.parse(["--data", "markov", "--vocab-size", 256, *run]))
    assert abs(got - markov.item()) > 1e-3


@pytest.mark.parametrize("no_progress, shown", [(False, True), (True, False)])
def test_no_progress_hides_the_bar_every_trainer_shows(monkeypatch, no_progress, shown):
    # every trainer's loop is gpt.train.train_loop, whose bar this is; on a terminal it shows
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    bar = train.progress_bar(train.parse(["--no-progress"] if no_progress else []), 3, is_main=True)
    disabled = bar.disable
    bar.close()
    assert disabled is not shown


def refusal(main, argv, monkeypatch, capsys, world):
    if world is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in argv])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def entry(name):
    """An entry point's main (the benchmark's command line: its parse, which checks it before
    any process group, as main would)."""
    import importlib
    module = importlib.import_module(f"tp_from_scratch.{name}")
    return module.parse if name == "bench.train" else module.main


@pytest.mark.parametrize("trainer", ["gpt.train", "sequence_parallel.train", "partial_sync.train",
                                     "parallelisms.train"])
@pytest.mark.parametrize("argv, message", [
    (["--save-every", 2], "--save-every N saves into --save DIR: give --save too"),
    (["--save-format", "dcp"], "--save-format says how --save DIR is written: give --save too"),
    (["--equal-steps", 2], "--equal-steps N says how many steps must equal one device's: give --compare-single"),
    (["--eval-every", -1], "--eval-every must be at least 0, got -1"),
    (["--steps", -1], "--steps must be at least 0, got -1"),
    (["--tp", 0], "--tp must be at least 1, got 0"),
    (["--equal-steps", 0, "--compare-single"], "--equal-steps must be at least 1, got 0"),
])
def test_every_trainer_refuses_a_shared_option_the_same_way(monkeypatch, capsys, trainer, argv, message):
    # the shared flags are checked in one place (gpt.train.validate, on gpt/options.py's rules)
    assert message in refusal(entry(trainer), argv, monkeypatch, capsys, world=2)


@pytest.mark.parametrize("main, argv, world, message", [
    # the pipeline cannot evaluate the whole model on one rank
    ("parallelisms.train", ["--pp", 2, "--eval-every", 2], 2, "--eval-every evaluates the whole model"),
    ("parallelisms.train", ["--save", "x"], 2, "parallelisms.train runs --impl scratch without --save / --load"),
    # Lesson 8 without torchrun: simulated ranks only train and meter
    ("partial_sync.train", ["--tp", 2, "--plot", "x.png", "--eval-every", 2], None,
     "--plot, --eval-every: only under torchrun"),
    ("partial_sync.train", ["--tp", 2, "--save", "x", "--save-every", 1], None, "--save: only under torchrun"),
    ("partial_sync.train", ["--tp", 2, "--compare-single", "--equal-steps", 1], None,
     "--compare-single, --equal-steps: only under torchrun"),
    # the benchmark and the ViT have command lines of their own: a trainer flag is not theirs
    ("bench.train", ["--data", "text"], 2, "unrecognized arguments: --data text"),
    ("bench.train", ["--rounds", 0], 2, "--rounds must be at least 1, got 0"),
    ("bench.train", [], 3, "is not divisible by tp=3: DTensor's ColwiseParallel"),
    ("gpt.vit", ["--eval-every", 2], None, "unrecognized arguments: --eval-every 2"),
])
def test_what_a_trainer_cannot_honour_is_refused(monkeypatch, capsys, main, argv, world, message):
    assert message in refusal(entry(main), argv, monkeypatch, capsys, world)


# every trainer's --equal-steps verdict, in-process in a world of one: the per-step check is made
# to fail from step 1 on, so each entry point must print where the runs part and exit 0 when the
# first N steps are still equal (--equal-steps 1), 1 when they are not (--equal-steps 2)
TINY_GPT = ["--hidden", 16, "--heads", 2, "--kv-heads", 1, "--layers", 1, "--seq-len", 8]
ENTRY_POINTS = {"gpt.train": TINY_GPT, "sequence_parallel.train": TINY_GPT, "partial_sync.train": TINY_GPT,
                "parallelisms.train": TINY_GPT, "deepseek.train": ["--seq-len", 8]}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("equal_steps, status", [(1, 0), (2, 1)])
@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_every_trainer_prints_the_same_equal_steps_verdict_and_exits_by_it(monkeypatch, capsys, name,
                                                                            equal_steps, status):
    import importlib
    monkeypatch.setenv("WORLD_SIZE", "1")   # Lesson 8's trainer: launched, not simulated
    for var in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(train, "verdict", lambda loss, ref, step, tol: (step < 1, "equal" if step < 1 else "DIFFERS"))
    main = importlib.import_module(f"tp_from_scratch.{name}").main
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in ["--steps", 3, "--compare-single", "--equal-steps", equal_steps, "--batch-size", 2,
                               "--no-progress", *ENTRY_POINTS[name]]])
    out = capsys.readouterr().out
    verdict = next((line for line in out.splitlines() if line.startswith("steps 0..0 equal to one device")), None)
    assert verdict is not None and "step 1 differs" in verdict, out[-2000:]
    assert verdict.endswith(" (allowed by --equal-steps 1)") == (equal_steps == 1), verdict
    assert "comparison (tolerance" in out   # the header the verdict line stands under
    assert exit_info.value.code == status, out[-2000:]


# Lesson 6's ViT (gpt.vit) has --equal-steps too and prints the same Comparison; its verdict needs
# a world of 2, so the launcher is left out: the world reads 2 and the "TP" model is the single-device
# one (vit_to_tp: identity), the per-step check failing from step 1 on as above
@pytest.mark.timeout(120)
@pytest.mark.parametrize("equal_steps, status", [(1, 0), (2, 1)])
def test_the_vit_prints_the_same_equal_steps_verdict_and_exits_by_it(monkeypatch, capsys, equal_steps, status):
    import argparse
    from types import SimpleNamespace

    import torch.distributed as dist

    from tp_from_scratch.gpt import vit
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(dist, "group", SimpleNamespace(WORLD="the world of 2"))
    monkeypatch.setattr(vit, "vit_to_tp", lambda group, model: model)
    monkeypatch.setattr(train, "verdict", lambda loss, ref, step, tol: (step < 1, "equal" if step < 1 else "DIFFERS"))
    args = argparse.Namespace(steps=3, dtype="float32", seed=0, compare_single=True, equal_steps=equal_steps)
    code = vit.train_and_compare(args)
    out = capsys.readouterr().out
    verdict = next((line for line in out.splitlines() if line.startswith("steps 0..0 equal to one device")), None)
    assert verdict is not None and "step 1 differs" in verdict, out[-2000:]
    assert verdict.endswith(" (allowed by --equal-steps 1)") == (equal_steps == 1), verdict
    assert "comparison (tolerance" in out and code == status, out[-2000:]
