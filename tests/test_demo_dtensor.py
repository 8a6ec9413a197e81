"""The seed's DTensor example runs for real (torchrun, 2 CPU ranks, gloo) and agrees with shard().

Each rank asserts, bit-exactly, that its DTensor local shard equals our
shard(x, t, axis)[rank]; the demo exits non-zero if any rank disagrees.
"""
import sys

import pytest

from tests.slow import only_in_test_slow
from tp_from_scratch.comm import launchers
from tp_from_scratch.demos import dtensor_shard


# in make test-slow: make test launches the demo as Lesson 1 shows it (the seed's Shard(0), its
# notebook runs in make test); here the other axis, on a shape that is not square
@only_in_test_slow("the demo's second axis under torchrun")
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_dtensor_shard_1_equals_our_shard_along_axis_1():
    cmd = [sys.executable, "-m", "tp_from_scratch.demos.dtensor_shard", "--rows", "6", "--cols", "64", "--axis", "1"]
    proc = launchers.run_command(cmd, timeout=170)
    assert proc.returncode == 0, proc.stdout
    for rank in (0, 1):
        assert (f"rank {rank}: Global shape: torch.Size([6, 64]), Local shape: torch.Size([6, 32]), "
                f"placements (Shard(dim=1),); equals shard(x, 2, axis=1)[{rank}] bit-exactly") in proc.stdout


def test_a_size_the_ranks_do_not_divide_is_refused_before_launching(capsys):
    with pytest.raises(SystemExit) as stop:
        dtensor_shard.main(["--rows", "5", "--axis", "0"])
    assert stop.value.code == 2
    assert "dimension 0 (rows) of size 5 is not divisible by tp=2" in capsys.readouterr().err


def test_under_mpiexec_it_says_to_use_torchrun(monkeypatch, capsys):
    monkeypatch.setenv("PMI_RANK", "0")  # what mpiexec sets in each rank
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit):
        dtensor_shard.main([])
    assert "launch with torchrun, not mpiexec" in capsys.readouterr().err


def test_missing_torchrun_is_said_clearly(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(launchers, "VENV_BIN", tmp_path)  # no venv launcher ...
    monkeypatch.setenv("PATH", str(tmp_path))           # ... and nothing on PATH
    for name in ("RANK", "TORCHELASTIC_RUN_ID", "PMI_RANK"):
        monkeypatch.delenv(name, raising=False)         # not launched yet: the demo must start torchrun
    assert dtensor_shard.main([]) == 2
    err = capsys.readouterr().err
    assert "cannot run the DTensor demo: torchrun not found" in err
    assert "pip install torch==2.13.0" in err
