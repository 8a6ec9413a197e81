"""Checkpoints say what model they hold, and every loader checks it (issue 24, cases F1, F2, F25).

A partially synchronized GPT (Lesson 8, p < 1) is another model than the GPT: its checkpoint is
refused, naming both sides, by Lesson 6's and Lesson 7's trainers, by generate, by the
checkpoint export and by convert's export; Lesson 8's trainer takes it at its own t and p only.
A resume never goes back: --steps below the checkpoint's step is refused before any work.
Everything here is decided before a process group exists, so it runs in-process.
"""
import pytest
import torch

from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import train
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.parallelize import shard_state_dict

# the trainers' command line for CONFIG
SIZE = ["--vocab-size", "13", "--seq-len", "8", "--layers", "1", "--hidden", "16", "--heads", "4",
        "--kv-heads", "2", "--ffn", "32"]
CONFIG = GPTConfig(vocab_size=13, seq_len=8, n_layers=1, hidden=16, n_heads=4, n_kv_heads=2, ffn=32)


def save(root, tp=2, step=6, sync_fraction=1.0):
    """A checkpoint of CONFIG as the trainer writes it (Lesson 8's when sync_fraction < 1)."""
    model = init_gpt(CONFIG, 0)
    opt = torch.optim.AdamW(model.parameters())
    name = ckpt.new_checkpoint_name(step)
    records = [ckpt.write_shard(root, name, r, tp, shard_state_dict(model.state_dict(), tp, r, CONFIG),
                                ckpt.shard_optimizer_state(ckpt.optimizer_state_by_name(model, opt), tp, r, CONFIG))
               for r in range(tp)]
    # the metadata Lesson 8's trainer has always written (p in "sync_fraction"), from which
    # the model description follows
    ckpt.commit(root, name, CONFIG, tp, step, records, {"optimizer": "adamw", "sync_fraction": sync_fraction})
    return root


@pytest.fixture
def caat(tmp_path):
    """A partial-sync checkpoint: p = 0.5 at t = 2."""
    return save(tmp_path / "caat", sync_fraction=0.5)


def refused(main, argv, monkeypatch, capsys, world=2, status=2):
    """Run an entry point's main in-process; its exit status and what it printed."""
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in argv])
    out = capsys.readouterr()
    assert exit_info.value.code == status, out
    return out.out + out.err


PARTIAL = "holds a partially synchronized GPT (--arch gpt, --sync-fraction 0.5 at --tp 2)"


def test_the_description_is_in_the_metadata_and_old_checkpoints_are_described_from_sync_fraction(caat):
    _, meta = ckpt.read_metadata(caat)
    assert meta["model"] == {"family": "gpt", "arch": "gpt", "partial_sync": {"sync_fraction": 0.5, "tp": 2}}
    old = {k: v for k, v in meta.items() if k != "model"}   # written before descriptions existed
    assert ckpt.description_of(old) == meta["model"]
    assert ckpt.description_of({"tp": 4, "config": CONFIG.to_dict()})["partial_sync"] is None


@pytest.mark.parametrize("trainer", ["gpt", "sequence_parallel"])
def test_F1_lesson_6_and_7_trainers_refuse_a_partial_sync_checkpoint(caat, trainer, monkeypatch, capsys):
    import importlib
    main = importlib.import_module(f"tp_from_scratch.{trainer}.train").main
    out = refused(main, ["--tp", 2, "--steps", 8, "--load", caat, *SIZE], monkeypatch, capsys)
    assert PARTIAL in out and "but this run expects an ordinary GPT" in out, out
    assert "python -m tp_from_scratch.partial_sync.train --tp 2 --sync-fraction 0.5 can load it" in out


def test_F1_lesson_8_trainer_takes_it_at_its_own_t_and_p_only(caat, monkeypatch, capsys):
    from tp_from_scratch.partial_sync import train as caat_train
    ok = caat_train.parse(["--tp", 2, "--sync-fraction", 0.5, "--steps", 8, "--load", caat, *SIZE])
    assert caat_train.validate(ok, 2) is None
    out = refused(caat_train.main, ["--tp", 1, "--sync-fraction", 0.5, "--steps", 8, "--load", caat, *SIZE],
                  monkeypatch, capsys)
    assert PARTIAL in out and "expects a partially synchronized GPT (--arch gpt, --sync-fraction 0.5 at --tp 1)" in out
    out = refused(caat_train.main, ["--tp", 2, "--sync-fraction", 0.25, "--steps", 8, "--load", caat, *SIZE],
                  monkeypatch, capsys)
    assert PARTIAL in out and "--sync-fraction 0.25 at --tp 2" in out
    # a plain checkpoint is p = 1: refused at p < 1, taken at p = 1 (and at any t: it reshards)
    plain = save(caat.parent / "plain")
    out = refused(caat_train.main, ["--tp", 2, "--sync-fraction", 0.5, "--steps", 8, "--load", plain, *SIZE],
                  monkeypatch, capsys)
    assert "holds an ordinary GPT (--arch gpt, every activation synchronized)" in out
    assert caat_train.validate(caat_train.parse(["--tp", 4, "--steps", 8, "--load", plain, *SIZE]), 4) is None


def test_F1_the_load_functions_refuse_it_too(caat):
    # what a trainer's run reads after validation, and what every other loader calls
    with pytest.raises(ckpt.CheckpointError, match=r"but this run expects an ordinary GPT"):
        ckpt.load_full(caat)
    with pytest.raises(ckpt.CheckpointError, match=r"partially synchronized"):
        ckpt.load_shard(caat, CONFIG, 2, 0)
    expected = ckpt.model_description(CONFIG, 2, 0.5)
    assert ckpt.load_full(caat, CONFIG, expected)["step"] == 6


def test_F1_checkpoint_export_refuses_it(caat, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        ckpt.main(["export", str(caat), str(tmp_path / "out.pt")])
    assert exit_info.value.code == 1 and PARTIAL in capsys.readouterr().err
    assert not (tmp_path / "out.pt").exists()


def test_checkpoint_info_shows_any_model_and_says_which(caat, capsys):
    ckpt.main(["info", str(caat)])
    assert "holds a partially synchronized GPT (--arch gpt, --sync-fraction 0.5 at --tp 2)" in capsys.readouterr().out


def test_F1_convert_export_refuses_it(caat, tmp_path, capsys):
    from tp_from_scratch.gpt import convert
    with pytest.raises(SystemExit) as exit_info:
        convert.main(["export", str(caat), "--out", str(tmp_path / "hf")])
    assert exit_info.value.code == 1 and PARTIAL in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


def test_F2_generate_refuses_it(caat, monkeypatch, capsys):
    from tp_from_scratch.gpt import generate
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        generate.main(["--load", str(caat), "--prompt", "1,2,3", "--new-tokens", "2"])
    out = capsys.readouterr()
    assert exit_info.value.code == 1 and PARTIAL in out.err, out
    assert "Traceback" not in out.err


@pytest.mark.parametrize("trainer", ["gpt", "sequence_parallel"])
def test_F25_steps_below_the_checkpoints_step_are_refused(tmp_path, trainer, monkeypatch, capsys):
    import importlib
    main = importlib.import_module(f"tp_from_scratch.{trainer}.train").main
    root = save(tmp_path / "ck", tp=1, step=6)
    before = (root / "latest").read_text()
    out = refused(main, ["--steps", 2, "--load", root, "--save", root, *SIZE], monkeypatch, capsys, world=1)
    assert "--steps 2 is below the checkpoint's step 6" in out, out
    assert (root / "latest").read_text() == before and len(list(root.glob("step_*"))) == 1  # nothing written
    # at or above the loaded step a resume is fine
    assert train.validate(train.parse(["--steps", 6, "--load", root, *SIZE]), 1) is None


def test_F25_the_run_itself_refuses_to_go_back(tmp_path):
    # a run started without validate (a script calling train.run) reads the same rule on load
    root = save(tmp_path / "ck", tp=1, step=6)
    _, meta = ckpt.read_metadata(root)
    with pytest.raises(ckpt.CheckpointError, match="--steps 2 is below the checkpoint's step 6"):
        ckpt.check_resume(meta, root, 2)
    ckpt.check_resume(meta, root, 6)
