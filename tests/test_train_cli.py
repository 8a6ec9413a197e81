"""Nonsense on the training command line stops at once with a message naming the problem.

All of these are caught before any process group exists, so they run in-process.
"""
import pytest

from tp_from_scratch.gpt import train


@pytest.mark.parametrize("argv, world, message", [
    (["--steps", "-3"], 1, "--steps must be at least 0, got -3"),
    (["--tp", "0"], 1, "--tp must be at least 1, got 0"),
    (["--tp", "2"], 3, "world size 3 is not divisible by tp=2"),
    (["--tp", "2", "--batch-size", "7"], 4, "batch size 7 is not divisible by dp=2"),
    (["--tp", "4", "--impl", "dtensor", "--hidden", "30", "--heads", "6", "--kv-heads", "6"], 4,
     "n_heads 6 is not divisible by tp=4: DTensor's ColwiseParallel"),   # --impl scratch splits them 2, 2, 1, 1
    (["--tp", "4", "--heads", "3", "--kv-heads", "3", "--hidden", "48"], 4, "tp=4 is larger than n_heads 3"),
    (["--tp", "4", "--ffn", "3"], 4, "tp=4 is larger than ffn size 3"),
    (["--tp", "6", "--hidden", "48", "--heads", "12"], 6, "tp=6 is larger than n_kv_heads 4 but not a multiple of it"),
    (["--tp", "2", "--vocab-size", "1"], 2, "tp=2 is larger than vocab size 1"),
    (["--hidden", "30", "--heads", "4"], 1, "hidden size 30 is not divisible by n_heads 4"),
    (["--impl", "dtensor", "--save", "x"], 1, "--save and --load work with --impl scratch only"),
    (["--impl", "dtensor", "--tp", "4", "--kv-heads", "2"], 4,
     "--impl dtensor needs the KV heads (n_kv_heads, --kv-heads) divisible by tp (got 2 and 4)"),
])
def test_bad_arguments_are_refused_with_a_clear_message(monkeypatch, capsys, argv, world, message):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_only_rank_0_prints_the_message(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--tp", "2"])
    assert exit_info.value.code == 2 and capsys.readouterr().err == ""


def test_good_arguments_pass_validation():
    assert train.validate(train.parse(["--tp", "2", "--steps", "0"]), 4) is None


def test_loading_a_checkpoint_of_another_model_fails_clearly(tmp_path, monkeypatch, capsys):
    # refused before any process group exists: validation reads the checkpoint's meta.json
    import torch

    from tp_from_scratch.gpt import checkpoint as ckpt
    from tp_from_scratch.gpt.model import init_gpt
    config = train.parse([]).model
    model = init_gpt(config, 0)
    name = ckpt.new_checkpoint_name(1)
    record = ckpt.write_shard(tmp_path / "ck", name, 0, 1, model.state_dict(),
                              ckpt.optimizer_state_by_name(model, torch.optim.AdamW(model.parameters())))
    ckpt.commit(tmp_path / "ck", name, config, 1, 1, [record])
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--steps", "2", "--load", str(tmp_path / "ck"), "--hidden", "32"])
    assert exit_info.value.code == 2
    assert "different model config: hidden=64 in the checkpoint, 32 in this run" in capsys.readouterr().err


def test_a_dtensor_parameter_counts_its_local_shard(monkeypatch):
    """count_parameters counts what this rank holds, not the global shape a DTensor describes:
    a parameter claiming a (6, 4) global shape while this rank holds (3, 4) counts 12."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from tp_from_scratch.comm.launchers import free_port
    from tp_from_scratch.gpt.model import count_parameters
    # monkeypatch: MASTER_ADDR left behind would make later tests of this worker look launched by torchrun
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        local = torch.zeros(3, 4, dtype=torch.float64)
        shard = DTensor.from_local(local, init_device_mesh("cpu", (1,)), [Shard(0)], run_check=False,
                                   shape=torch.Size((6, 4)), stride=(4, 1))
        layer = torch.nn.Module()
        layer.weight = torch.nn.Parameter(shard)
        assert layer.weight.numel() == 24  # the global shape
        assert count_parameters(layer) == (12, 96)
    finally:
        dist.destroy_process_group()
