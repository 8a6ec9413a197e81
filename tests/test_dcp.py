"""Checkpoints in PyTorch's Distributed Checkpoint format (gpt/dcp.py), in-process.

A checkpoint the course writes at t = 2 (one DCP file per rank, each rank's pieces placed by the
plan) is read back by DCP's planner at t = 4, 3 and 1, bit for bit, uneven vocabulary rows and
shared KV heads included, and DeepSeek-V3's layouts too; any tool reads it without a process
group (dcp.load, dcp_to_torch_save, which gives what `checkpoint export` gives); damaged,
foreign and interrupted checkpoints are refused or survived as the course's own format's are.
The checkpoints of 4 real processes (the trainer's resume, the uneven trap, DTensor's
parallelize_module) are tests/test_dcp_launched.py's.
"""
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as torch_dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests.test_checkpoint import CONFIG, save_sharded
from tp_from_scratch.comm.launchers import run_command, subprocess_env
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import dcp, optim, train
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.parallelize import shard_tensor

LLAMA = GPTConfig(arch="llama", vocab_size=11, seq_len=8, n_layers=1, hidden=16, n_heads=4, n_kv_heads=2, ffn=24,
                  tie_embeddings=False)
# every split uneven at t = 2, 3 and 4: heads (whole), KV heads, the FFN width, the vocabulary
UNEVEN = GPTConfig(arch="llama", vocab_size=11, seq_len=8, n_layers=1, hidden=40, n_heads=10, n_kv_heads=5, ffn=22,
                   tie_embeddings=False)
SIZE = ["--vocab-size", "13", "--seq-len", "8", "--layers", "1", "--hidden", "16", "--heads", "4",
        "--kv-heads", "2", "--ffn", "32"]   # CONFIG's command line


def trained(config, seed):
    """A model's state and the trainers' AdamW state after one step on random gradients (every moment non-zero)."""
    model = init_gpt(config, seed, torch.float64)
    opt = optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed + 1)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
    opt.step()
    return model.state_dict(), ckpt.optimizer_state_by_name(model, opt)


def step_directory(root):
    return ckpt.read_metadata(root)[0]


@pytest.mark.parametrize("config, t", [(CONFIG, 4), (CONFIG, 1), (LLAMA, 4), (LLAMA, 1), (UNEVEN, 3), (UNEVEN, 4)],
                         ids=["gpt-4", "gpt-1", "llama-4", "llama-1", "uneven-3", "uneven-4"])
def test_saved_at_t2_every_rank_at_another_t_reads_its_pieces_bitwise(tmp_path, config, t):
    # at t = 2 the vocabulary rows are uneven (13: 7, 6); at t = 4 they are 4, 3, 3, 3 and each KV
    # head sits on two ranks; UNEVEN's 5 KV heads (10 query heads) and FFN 22 split unevenly at
    # t = 2, 3 and 4 (KV heads 3, 2; 2, 2, 1; 2, 1, 1, 1). DCP's planner reads each rank's chunks
    # from the saved ones: moving data only, so every bit must come back
    model, optimizer = trained(config, seed=t)
    ckpt.write_dcp(tmp_path, model, optimizer, config, tp=2, step=7)
    assert sorted(p.name for p in step_directory(tmp_path).iterdir()) == [".metadata", "__0_0.distcp",
                                                                          "__1_0.distcp", "meta.json"]
    for r in range(t):
        local = ckpt.load_shard(tmp_path, config, t, r)
        assert local["step"] == 7
        for name, full in model.items():
            assert_matches_reference(local["model"][name], shard_tensor(name, full, t, r, config),
                                     name=name, rank=r, exact=True)
        for name, entries in optimizer.items():
            for k, v in entries.items():
                want = shard_tensor(name, v, t, r, config) if v.ndim > 0 else v
                assert_matches_reference(local["optimizer"][name][k], want, name=f"{k} of {name}", rank=r, exact=True)


def test_each_piece_is_stored_once_at_its_true_offset(tmp_path):
    # saved at t = 4: the vocabulary rows at their array_split offsets (13 rows: 4, 3, 3, 3), each
    # of the 2 KV heads once although two ranks hold it, a norm (whole on every rank) once
    model, optimizer = trained(CONFIG, seed=0)
    ckpt.write_dcp(tmp_path, model, optimizer, CONFIG, tp=4)
    stored = torch_dcp.FileSystemReader(step_directory(tmp_path)).read_metadata().state_dict_metadata

    def chunks(key):
        return sorted((tuple(c.offsets), tuple(c.sizes)) for c in stored[key].chunks)

    assert chunks("wte.weight") == [((0, 0), (4, 16)), ((4, 0), (3, 16)), ((7, 0), (3, 16)), ((10, 0), (3, 16))]
    assert chunks("optimizer.state.wte.weight.exp_avg") == chunks("wte.weight")
    assert chunks("blocks.0.attn.k.weight") == [((0, 0), (4, 16)), ((4, 0), (4, 16))]
    assert chunks("ln_f.weight") == [((0,), (16,))]


def test_any_tool_reads_it_whole_without_a_process_group(tmp_path):
    # t = 1 the way an engineer's script does it: dcp.load into full tensors, no process group;
    # and dcp_to_torch_save's single file holds exactly what `checkpoint export` writes
    assert not dist.is_initialized()
    model, optimizer = trained(CONFIG, seed=1)
    ckpt.write_dcp(tmp_path / "dcp", model, optimizer, CONFIG, tp=2, step=5)
    directory = step_directory(tmp_path / "dcp")
    state = {name: torch.zeros_like(value) for name, value in model.items()}
    torch_dcp.load(state, checkpoint_id=directory, no_dist=True)
    for name, value in model.items():
        assert_matches_reference(state[name], value, name=f"{name} by dcp.load", exact=True)
    dcp_to_torch_save(directory, tmp_path / "dcp.pt")
    ckpt.main(["export", str(tmp_path / "dcp"), str(tmp_path / "export.pt")])
    converted = torch.load(tmp_path / "dcp.pt", weights_only=True)
    exported = torch.load(tmp_path / "export.pt", weights_only=True)["model"]
    # the model's tensors under the single-device names at the top level (torchtitan's convention);
    # beside them only the optimizer's state and the step
    assert {k for k in converted if not k.startswith(("optimizer.state.", "train_state."))} == set(exported)
    for name, value in exported.items():
        assert_matches_reference(converted[name], value, name=f"{name}: dcp_to_torch_save vs export", exact=True)
    assert int(converted["train_state.step"]) == 5
    # and the course's own format, exported, holds the same tensors
    save_sharded(tmp_path / "course", model, optimizer, tp=2, step=5)
    ckpt.main(["export", str(tmp_path / "course"), str(tmp_path / "course.pt")])
    for name, value in torch.load(tmp_path / "course.pt", weights_only=True)["model"].items():
        assert torch.equal(exported[name], value), name


def test_the_placement_is_the_plans_cut_and_the_full_shapes_its_glue():
    # every piece the plan cuts is a choice of slices along one axis; its runs, read back from
    # the full tensor, are the piece, and the pieces' shapes glue to the full shape
    for config, ts in ((LLAMA, (1, 2, 4)), (UNEVEN, (2, 3, 4))):
        check_placement(config, ts)


def check_placement(config, ts):
    model, _ = trained(config, seed=2)
    for t in ts:
        pieces = [{n: shard_tensor(n, v, t, r, config) for n, v in model.items()} for r in range(t)]
        shapes = dcp.full_shapes([{n: tuple(p.shape) for n, p in piece.items()} for piece in pieces],
                                 {"config": config.to_dict()}, ckpt.GPT_SHARDING)
        assert shapes == {n: tuple(v.shape) for n, v in model.items()}
        for r in range(t):
            for name, full in model.items():
                runs = dcp.placement(name, full.shape, t, r, config, ckpt.GPT_SHARDING)
                got = [full if axis is None else full.narrow(axis, offsets[axis], length)
                       for offsets, axis, _, length in runs]
                axis = runs[0][1]
                assert torch.equal(got[0] if axis is None else torch.cat(got, axis), pieces[r][name]), (name, t, r)


def test_deepseek_v3_layouts_reshard_through_dcp(tmp_path):
    # saved under expert parallelism at t = 2; read at t = 4 in the expert-TP layout (each expert's
    # stacked gate/up halves cut alike: two chunks per rank), and in the other layouts
    from tp_from_scratch.deepseek import train as ds_train
    from tp_from_scratch.deepseek.arch import shard
    from tp_from_scratch.deepseek.checkpoint import DESCRIPTION, DeepSeekSharding, _ours
    config = ds_train.model_config(ds_train.parse(["--experts", 4]))
    g = torch.Generator().manual_seed(3)
    full = {k: torch.randn(v.shape, generator=g, dtype=torch.float64)
            for k, v in ds_train.init_model(config, 0, torch.float64).state_dict().items()}
    saved_in = DeepSeekSharding("expert parallel")
    pieces = [{k: saved_in.shard(k, v, 2, r, config) for k, v in full.items()} for r in range(2)]
    assert dcp.full_shapes([{k: tuple(p.shape) for k, p in piece.items()} for piece in pieces],
                           {"config": config.to_dict(), "layout": "expert parallel"}, saved_in) == \
        {k: tuple(v.shape) for k, v in full.items()}
    ckpt.write_dcp(tmp_path, full, {}, config, 2, extra={"layout": "expert parallel"}, description=DESCRIPTION,
              sharding=saved_in)
    for layout, t in [("expert tensor parallel", 4), ("experts on all tokens", 2), ("expert parallel", 4)]:
        for r in range(t):
            local = ckpt.load_shard(tmp_path, config, t, r, DESCRIPTION, DeepSeekSharding(layout))
            for name, value in full.items():
                assert torch.equal(local["model"][name], shard(_ours(name), value, layout, t, r)), (name, layout, r)
    # Lesson 6's loaders refuse it by its description, as they refuse the course format's
    with pytest.raises(ckpt.CheckpointError, match="holds a DeepSeek-V3 model"):
        ckpt.load_full(tmp_path)


@pytest.mark.parametrize("damage, message", [
    ("flip", "is corrupt: its sha256 does not match"),
    ("truncate", "is truncated or corrupt: .* bytes, the metadata says"),
    ("delete", "is missing"),
    (".metadata", r"\.metadata is truncated or corrupt"),
    ("meta", "meta.json is corrupt or truncated"),
])
def test_a_damaged_dcp_checkpoint_is_refused_naming_the_file(tmp_path, damage, message):
    ckpt.write_dcp(tmp_path, *trained(CONFIG, 0), CONFIG, tp=2, step=1)
    directory = step_directory(tmp_path)
    target = directory / {"flip": "__1_0.distcp", "truncate": "__0_0.distcp", "delete": "__1_0.distcp",
                          ".metadata": ".metadata", "meta": "meta.json"}[damage]
    data = target.read_bytes()
    if damage == "flip":
        target.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif damage == "delete":
        target.unlink()
    else:
        target.write_bytes(data[: len(data) // 2])
    with pytest.raises(ckpt.CheckpointError, match=message):
        ckpt.load_full(tmp_path, CONFIG)
    if damage != "meta":
        with pytest.raises(ckpt.CheckpointError, match=message):
            ckpt.load_shard(tmp_path, CONFIG, 4, 1)


def main_of(monkeypatch, capsys, argv):
    """gpt.train's main in-process, in a world of one: (exit status, stdout, stderr)."""
    monkeypatch.setenv("WORLD_SIZE", "1")
    for var in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        train.main([str(a) for a in argv])
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


def test_the_trainer_refuses_a_truncated_or_foreign_dcp_checkpoint_in_one_line(tmp_path, monkeypatch, capsys):
    meta = ckpt.write_dcp(tmp_path / "ck", *trained(CONFIG, 0), CONFIG, tp=2, step=1, extra={"optimizer": "adamw"})
    shard = step_directory(tmp_path / "ck") / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])
    status, _, err = main_of(monkeypatch, capsys, ["--steps", 3, "--load", tmp_path / "ck", "--dtype", "float64",
                                                   "--no-progress", *SIZE])
    assert status == 1 and "Traceback" not in err, err
    assert err.strip() == (f"rank 0: error: checkpoint file {shard} is truncated or corrupt: 1000 bytes, "
                           f"the metadata says {meta['files'][shard.name]['bytes']}"), err
    # another tool's DCP directory (dcp.save of a plain state dict): refused before any work
    torch_dcp.save(init_gpt(CONFIG, 0).state_dict(), checkpoint_id=tmp_path / "foreign", no_dist=True)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as exit_info:
        train.main([str(a) for a in ["--steps", 3, "--load", tmp_path / "foreign", *SIZE]])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert f"{tmp_path / 'foreign'} is a PyTorch DCP checkpoint without tp_from_scratch's meta.json" in err, err


def test_checkpoint_info_verifies_a_dcp_checkpoint(tmp_path, capsys):
    ckpt.write_dcp(tmp_path, *trained(CONFIG, 0), CONFIG, tp=2, step=4)
    ckpt.main(["info", str(tmp_path)])
    out = capsys.readouterr().out
    assert "PyTorch DCP checkpoint: 3 files verified (size and sha256)" in out and "an ordinary GPT" in out


def test_a_failed_dcp_save_leaves_the_previous_checkpoint_and_its_leftovers_go(tmp_path, monkeypatch):
    # the rename that puts a staged save in place fails (a full disk, a kill): ``latest`` still
    # names the previous checkpoint, which loads; the next save removes the staging directory
    ckpt.write_dcp(tmp_path, *trained(CONFIG, 0), CONFIG, tp=2, step=1)

    def failing_rename(src, dst):
        raise OSError(28, "No space left on device (simulated)")

    monkeypatch.setattr(ckpt.os, "rename", failing_rename)
    with pytest.raises(OSError, match="No space left"):
        ckpt.write_dcp(tmp_path, *trained(CONFIG, 1), CONFIG, tp=2, step=2)
    monkeypatch.undo()
    assert ckpt.load_full(tmp_path, CONFIG)["step"] == 1
    assert len(list(tmp_path.glob(".step_00000002-*.staging"))) == 1 and not list(tmp_path.glob("step_00000002*"))
    ckpt.write_dcp(tmp_path, *trained(CONFIG, 2), CONFIG, tp=2, step=3)
    assert ckpt.load_full(tmp_path, CONFIG)["step"] == 3 and not list(tmp_path.glob(".step_*"))


# For each kill point K, the child writes DCP checkpoint A (step 1) into root/K, then forks; the fork
# writes checkpoint B (step 2) and SIGKILLs itself at K. One Python start-up for all K.
KILLER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import tests.test_dcp as t
    from torch.distributed.checkpoint import FileSystemWriter
    from tp_from_scratch.gpt import checkpoint as ckpt, dcp
    root = Path(sys.argv[1])

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    def dying_write(name):
        original = ckpt.write_atomic
        def write(path, data):
            if Path(path).name == name:
                Path(path).with_name("." + name + ".tmp-dying").write_bytes(data[: len(data) // 2])
                die()
            original(path, data)
        return write

    for kill_at in sys.argv[2:]:
        ckpt.write_dcp(root / kill_at, *t.trained(t.CONFIG, 1), t.CONFIG, tp=2, step=1)
        pid = os.fork()
        if pid == 0:
            if kill_at == "data":          # every rank's file written, DCP's .metadata not yet
                FileSystemWriter.finish = die
            elif kill_at == "rename":
                ckpt.os.rename = die
            else:                          # half of meta.json, or of latest, written
                ckpt.write_atomic = dying_write(kill_at)
            ckpt.write_dcp(root / kill_at, *t.trained(t.CONFIG, 2), t.CONFIG, tp=2, step=2)
            os._exit(0)  # the kill never happened
        _, status = os.waitpid(pid, 0)
        print(kill_at, "killed" if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
              else f"not killed (status {status})", flush=True)
""")

KILL_POINTS = ["data", "meta.json", "rename", "latest"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_killed_mid_dcp_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    out = run_command([sys.executable, "-c", KILLER, str(tmp_path), *KILL_POINTS], timeout=100, env=subprocess_env())
    assert out.returncode == 0, out.stdout
    expected = trained(CONFIG, 1)[0]
    for kill_at in KILL_POINTS:
        assert f"{kill_at} killed" in out.stdout, f"the save was not killed at {kill_at}:\n{out.stdout}"
        loaded = ckpt.load_full(tmp_path / kill_at, CONFIG)
        assert loaded["step"] == 1, f"killed at {kill_at}: latest moved to step {loaded['step']}"
        for name, value in expected.items():
            assert torch.equal(loaded["model"][name], value), (kill_at, name)
