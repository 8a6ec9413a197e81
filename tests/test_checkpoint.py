"""Sharded checkpoints: exact round trips at any tp, clear errors, and nothing lost to a kill."""
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import optim
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.parallelize import shard_state_dict, shard_tensor
from tp_from_scratch.comm.launchers import run_command, subprocess_env

CONFIG = GPTConfig(vocab_size=13, seq_len=8, n_layers=1, hidden=16, n_heads=4, n_kv_heads=2, ffn=32)


def trained_state(seed):
    """A model and the trainers' AdamW state after one step on random gradients: every moment non-trivial."""
    model = init_gpt(CONFIG, seed)
    opt = optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed + 1)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)
    opt.step()
    return model.state_dict(), ckpt.optimizer_state_by_name(model, opt)


def save_sharded(root, model_sd, opt_state, tp, step):
    """What train.save does on tp ranks, here in one process: write every shard, then commit."""
    name = ckpt.new_checkpoint_name(step)
    records = []
    for r in range(tp):
        local_opt = ckpt.shard_optimizer_state(opt_state, tp, r, CONFIG)
        records.append(ckpt.write_shard(root, name, r, tp, shard_state_dict(model_sd, tp, r, CONFIG),
                                        local_opt, torch.get_rng_state()))
    return ckpt.commit(root, name, CONFIG, tp, step, records)


@pytest.mark.parametrize("saved_tp", [1, 2])
@pytest.mark.parametrize("loaded_tp", [1, 2, 4])
def test_save_at_one_tp_load_at_another(tmp_path, saved_tp, loaded_tp):
    model_sd, opt_state = trained_state(seed=saved_tp)
    save_sharded(tmp_path, model_sd, opt_state, saved_tp, step=7)
    for r in range(loaded_tp):
        local = ckpt.load_shard(tmp_path, CONFIG, loaded_tp, r)
        assert local["step"] == 7
        # moving data only: every weight and AdamW moment must come back bit for bit
        for name, full in model_sd.items():
            assert_matches_reference(local["model"][name], shard_tensor(name, full, loaded_tp, r, CONFIG),
                                     name=name, rank=r, exact=True)
        for name, entries in opt_state.items():
            for k, v in entries.items():
                want = shard_tensor(name, v, loaded_tp, r, CONFIG) if v.ndim > 0 else v
                assert_matches_reference(local["optimizer"][name][k], want, name=f"{k} of {name}",
                                         rank=r, exact=True)
        assert (local["rng"] is not None) == (loaded_tp == saved_tp)


def test_a_different_model_config_is_refused(tmp_path):
    save_sharded(tmp_path, *trained_state(0), tp=2, step=1)
    other = GPTConfig(**{**CONFIG.to_dict(), "hidden": 32, "n_layers": 2})
    with pytest.raises(ckpt.CheckpointError, match=r"different model config: .*n_layers=1 in the "
                                                   r"checkpoint, 2 in this run.*hidden=16"):
        ckpt.load_full(tmp_path, other)


@pytest.mark.parametrize("damage, message", [
    ("flip", "is corrupt: its sha256 does not match"),
    ("truncate", "is truncated or corrupt: .* bytes, the metadata says"),
    ("delete", "is missing"),
    ("meta", "meta.json is corrupt or truncated"),
])
def test_damaged_checkpoint_gives_a_clear_error(tmp_path, damage, message):
    meta = save_sharded(tmp_path, *trained_state(0), tp=2, step=1)
    directory = tmp_path / (tmp_path / "latest").read_text().strip()
    shard = directory / meta["shards"][1]["file"]
    data = shard.read_bytes()
    if damage == "flip":
        shard.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif damage == "truncate":
        shard.write_bytes(data[: len(data) // 2])
    elif damage == "delete":
        shard.unlink()
    else:
        meta_path = directory / "meta.json"
        meta_path.write_text(meta_path.read_text()[:50])
    with pytest.raises(ckpt.CheckpointError, match=message):
        ckpt.load_full(tmp_path, CONFIG)


def temporaries(root):
    return [p.name for p in Path(root).rglob(".*.tmp-*")]


def test_a_failed_save_leaves_no_temporary_file_and_latest_unchanged(tmp_path, monkeypatch):
    # the final rename of a save (``latest``) fails, as on a full disk: the temporary goes, and
    # ``latest`` still names the previous checkpoint, which loads
    save_sharded(tmp_path, *trained_state(0), tp=2, step=1)
    latest = (tmp_path / "latest").read_text()
    rename = os.replace

    def failing_rename(src, dst):
        if Path(dst).name == "latest":
            raise OSError(28, "No space left on device (simulated)")
        return rename(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", failing_rename)
    with pytest.raises(OSError, match="No space left"):
        save_sharded(tmp_path, *trained_state(1), tp=2, step=2)
    monkeypatch.undo()
    assert temporaries(tmp_path) == []
    assert (tmp_path / "latest").read_text() == latest
    assert ckpt.load_full(tmp_path, CONFIG)["step"] == 1


def test_writing_onto_a_directory_fails_without_leaving_the_temporary(tmp_path):
    (tmp_path / "adir").mkdir()
    with pytest.raises(OSError):
        ckpt.write_atomic(tmp_path / "adir", b"payload")
    assert temporaries(tmp_path) == [] and (tmp_path / "adir").is_dir()


def test_no_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="does not exist"):
        ckpt.load_full(tmp_path / "nothing")
    with pytest.raises(ckpt.CheckpointError, match="neither a 'latest' file"):
        ckpt.load_full(tmp_path)


def test_export_and_import_single_device(tmp_path):
    model_sd, opt_state = trained_state(3)
    save_sharded(tmp_path / "ck", model_sd, opt_state, tp=2, step=5)
    ckpt.export_single_device(tmp_path / "ck", tmp_path / "single.pt")
    loaded = ckpt.load_full(tmp_path / "single.pt", CONFIG)  # what train --load FILE reads
    assert loaded["step"] == 5 and loaded["optimizer"] == {}
    for name, value in model_sd.items():
        assert_matches_reference(loaded["model"][name], value, name=name, exact=True)
    # the file loads into a plain single-device GPT
    model = init_gpt(CONFIG, 99)
    model.load_state_dict(loaded["model"])
    with pytest.raises(ckpt.CheckpointError, match="different model config"):
        ckpt.load_full(tmp_path / "single.pt", GPTConfig())
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ckpt.CheckpointError, match="corrupt or truncated"):
        ckpt.load_full(tmp_path / "bad.pt")


def test_old_checkpoints_are_pruned_and_latest_is_newest(tmp_path):
    for step in (1, 2, 3):
        save_sharded(tmp_path, *trained_state(step), tp=1, step=step)
    assert len(list(tmp_path.glob("step_*"))) == ckpt.KEEP
    assert ckpt.load_full(tmp_path)["step"] == 3


# For each kill point K, the child saves checkpoint A (step 1) completely into root/K, then
# forks; the fork starts saving checkpoint B (step 2) and SIGKILLs itself at its K-th atomic
# write, half-way through the bytes. Forking keeps this to one Python start-up for all K.
KILLER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import tests.test_checkpoint as t
    from tp_from_scratch.gpt import checkpoint as ckpt
    root = Path(sys.argv[1])
    for kill_at in map(int, sys.argv[2:]):
        t.save_sharded(root / str(kill_at), *t.trained_state(1), tp=2, step=1)
        pid = os.fork()
        if pid == 0:
            original, calls = ckpt.write_atomic, [0]
            def dying_write(path, data):
                calls[0] += 1
                if calls[0] == kill_at:
                    tmp = Path(path).with_name("." + Path(path).name + ".tmp-dying")
                    tmp.write_bytes(data[: len(data) // 2])
                    os.kill(os.getpid(), signal.SIGKILL)
                original(path, data)
            ckpt.write_atomic = dying_write
            t.save_sharded(root / str(kill_at), *t.trained_state(2), tp=2, step=2)
            os._exit(0)  # the kill never happened
        _, status = os.waitpid(pid, 0)
        print(kill_at, "killed" if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
              else f"not killed (status {status})", flush=True)
""")

# the writes of save B: 1 shard 0, 2 shard 1, 3 meta.json, 4 latest
KILL_POINTS = {2: "second shard", 3: "meta.json", 4: "latest"}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_killed_mid_save_leaves_previous_checkpoint_loadable(tmp_path):
    out = run_command([sys.executable, "-c", KILLER, str(tmp_path), *map(str, KILL_POINTS)], timeout=100,
                      env=subprocess_env())
    assert out.returncode == 0, out.stdout
    expected = trained_state(1)[0]
    for kill_at, where in KILL_POINTS.items():
        assert f"{kill_at} killed" in out.stdout, f"the save was not killed at {where}:\n{out.stdout}"
        loaded = ckpt.load_full(tmp_path / str(kill_at), CONFIG)
        assert loaded["step"] == 1, f"killed while writing {where}: latest moved to step {loaded['step']}"
        for name, value in expected.items():
            assert_matches_reference(loaded["model"][name], value, name=f"{name} (killed at {where})",
                                     exact=True)
