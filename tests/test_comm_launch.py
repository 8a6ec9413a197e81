"""Launch helpers and the TP_DEBUG fingerprint exchange, without launching anything heavy."""
import re
import sys

import numpy as np
import pytest

from tp_from_scratch.comm import (Comm, Fingerprint, SPMDError, comm_from_env, run_spmd,
                                  timeout_from_env)
from tp_from_scratch.comm.launch import launcher_from_env
from tp_from_scratch.comm.launchers import run_command, subprocess_env


@pytest.mark.parametrize("env, expected", [
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}, "torchrun"),
    ({"TORCHELASTIC_RUN_ID": "x"}, "torchrun"),
    ({"PMI_RANK": "0"}, "mpi"),
    ({"OMPI_COMM_WORLD_RANK": "1"}, "mpi"),
    ({"PMIX_RANK": "0"}, "mpi"),
    ({"RANK": "0"}, None),  # RANK alone is not torchrun
    ({}, None),
])
def test_launcher_is_recognised_from_its_environment(env, expected):
    assert launcher_from_env(env) == expected


def test_comm_from_env_without_a_launcher_says_how_to_launch(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RUN_ID", "PMI_RANK",
                "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(RuntimeError, match=r"mpiexec -n 4 .venv/bin/python -m .*torchrun --standalone --nproc-per-node 4"):
        comm_from_env()


def test_spmd_main_outside_a_launcher_exits_non_zero_and_says_why():
    code = "from tp_from_scratch.comm import spmd_main; spmd_main(lambda comm: None)"
    env = subprocess_env()
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RUN_ID", "PMI_RANK",
                "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        env.pop(key, None)
    result = run_command([sys.executable, "-c", code], timeout=60, env=env)
    assert result.returncode == 1
    assert "rank ? failed" in result.stdout and "no launcher found" in result.stdout


@pytest.mark.parametrize("value, expected", [(None, 30.0), ("2.5", 2.5)])
def test_tp_timeout_is_read_from_the_environment(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("TP_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("TP_TIMEOUT", value)
    assert timeout_from_env() == expected


@pytest.mark.parametrize("value, match", [("soon", "must be a number of seconds"), ("-1", "must be positive")])
def test_bad_tp_timeout_is_named(monkeypatch, value, match):
    monkeypatch.setenv("TP_TIMEOUT", value)
    with pytest.raises(ValueError, match=f"TP_TIMEOUT {match}"):
        timeout_from_env()


def test_fingerprint_survives_the_trip_between_processes():
    fp = Fingerprint("all_gather", shape=(np.int64(3), "*"), dtype="float32", axis=1, op="sum", root=None)
    assert Fingerprint.from_text(fp.as_text()) == fp
    assert Fingerprint.from_text(fp.as_text()) != Fingerprint("all_gather", shape=(4, "*"), dtype="float32",
                                                              axis=1, op="sum", root=None)


@pytest.mark.parametrize("late, rank2_side, other_side", [
    (dict(name="all_gather"), "rank 2 is in all_gather", "rank [01] is in all_reduce"),
    (dict(shape=(5,)), r"rank 2 is in all_reduce with shape=\(5,\)", r"rank [01] is in all_reduce with shape=\(4,\)"),
    (dict(dtype="<f4"), "rank 2 is in all_reduce with dtype='<f4'", "rank [01] is in all_reduce with dtype='<f8'"),
    (dict(root=1), "rank 2 is in all_reduce with root=1", "rank [01] is in all_reduce with root=0"),
])
def test_debug_fingerprint_exchange_names_the_disagreement(late, rank2_side, other_side):
    """The TP_DEBUG path of MPIComm/TorchComm (Comm._check_collective), run over the
    simulator's raw messages: every rank learns what every other rank is doing, so whichever
    rank reports first names both sides."""
    def fn(comm):
        params = dict(name="all_reduce", shape=(4,), dtype="<f8", root=0)
        if comm.rank == 2:
            params.update(late)
        name = params.pop("name")
        Comm._check_collective(comm, 0, Fingerprint(name, **params))  # the base-class exchange

    with pytest.raises(SPMDError, match="collective mismatch at collective call #0") as info:
        run_spmd(fn, 3, timeout=10)
    headline = str(info.value).splitlines()[0]
    assert re.search(rank2_side, headline) and re.search(other_side, headline), headline


def test_debug_fingerprint_exchange_passes_when_ranks_agree_and_is_not_metered():
    def fn(comm):
        Comm._check_collective(comm, 0, Fingerprint("all_reduce", shape=(4,)))
        return comm.meter.snapshot()["messages_sent"]

    assert run_spmd(fn, 3) == [0, 0, 0]


class ProcessLikeComm(Comm):
    """A one-rank process backend that notes each fingerprint check instead of exchanging it."""

    def __init__(self, debug):
        super().__init__(0, 1)
        self.debug, self.checked = debug, []

    def _check_collective(self, index, fingerprint):
        self.checked.append((index, fingerprint))


@pytest.mark.parametrize("debug", [False, True])
def test_process_backends_check_collectives_only_under_debug(debug):
    comm = ProcessLikeComm(debug)
    for _ in range(2):
        with comm.collective("all_reduce", np.ones(3), shape=(3,), dtype=np.dtype("float32")):
            with comm.collective("reduce_scatter", shape=(3,)):  # nested: never checked
                pass
    expected = [(k, Fingerprint("all_reduce", shape=(3,), dtype="float32")) for k in range(2)]
    assert comm.checks_collectives == debug
    assert comm.checked == (expected if debug else [])


def test_mpicomm_rejects_a_headerless_message_shorter_than_the_buffer():
    code = ("import numpy as np; from tp_from_scratch.comm import MPIComm; c = MPIComm(); "
            "c.send(np.ones(2), 0, header=False)\n"
            "try:\n    c.recv(0, out=np.empty(3), header=False)\n"
            "except ValueError as e:\n    print(e)")
    result = run_command([sys.executable, "-c", code], timeout=60)
    assert ("into a buffer of shape (3,) and dtype float64 (24 bytes) got a message of 16 bytes"
            in result.stdout), result.stdout


def test_mpicomm_works_as_a_single_process_world():
    # MPI initialises itself as a world of one when not under mpiexec ("singleton init")
    code = ("import numpy as np; from tp_from_scratch.comm import MPIComm; "
            "from tp_from_scratch import collectives as C; c = MPIComm(); x = np.arange(6.0); "
            "assert (c.rank, c.world_size) == (0, 1); assert (C.all_reduce(c, x) == x).all(); "
            "c.send(x, 0); assert (c.recv(0) == x).all(); c.barrier(); c.close(); print('ok')")
    result = run_command([sys.executable, "-c", code], timeout=60)
    assert result.returncode == 0 and "ok" in result.stdout, result.stdout
