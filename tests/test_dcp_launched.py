"""PyTorch DCP checkpoints written by 4 real processes: the trainer's resume at another t, the
uneven trap, and DTensor's parallelize_module on both sides of a checkpoint.

Everything runs in ONE torchrun launch (tests/spmd_scripts/dcp_interop.py), made once by the
``launched`` fixture; every reference is computed here, in the test process, which reads the
checkpoints back without a process group (DCP's no-dist load). The in-process tests are
tests/test_dcp.py.
"""
import json

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as torch_dcp
from torch.distributed.checkpoint.api import CheckpointException

from tests.spmd_scripts.dcp_interop import DTENSOR, SAVED_AT, SEED, STEPS, TRAP
from tp_from_scratch.comm.launchers import run_command, torchrun_command
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import dcp
from tp_from_scratch.gpt.model import init_gpt
from tp_from_scratch.gpt.parallelize import shard_tensor


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    out = tmp_path_factory.mktemp("dcp")
    # the course checkpoint the DTensor model loads: written here, at t = 2, by the course's writer
    ckpt.write_dcp(out / "course", init_gpt(DTENSOR, SEED + 1, torch.float64).state_dict(), {}, DTENSOR, tp=2)
    result = run_command(torchrun_command(4, "tests.spmd_scripts.dcp_interop", out), timeout=500)
    assert result.returncode == 0 and "dcp_interop done" in result.stdout, result.stdout[-4000:]
    return out


def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("resumed", ["resumed-tp4", "resumed-tp1"])
def test_a_dcp_checkpoint_resumes_at_another_t_with_the_uninterrupted_losses(launched, resumed):
    # the dp=2 x tp=2 run saved in DCP's format at step 3 on its way to 6; resumed from it at
    # tp=4 (uneven vocabulary rows, KV heads on two ranks) and at tp=1, every later step's loss
    # equals the uninterrupted run's within the float64 policy: weights, both AdamW moments and
    # the step came back from DCP's chunks, resharded
    uninterrupted, got = losses(launched / "uninterrupted-tp2.jsonl"), losses(launched / f"{resumed}.jsonl")
    assert sorted(got) == list(range(SAVED_AT, STEPS)), sorted(got)
    for step in range(SAVED_AT, STEPS):
        assert_matches_reference(np.float64(got[step]), np.float64(uninterrupted[step]),
                                 name=f"{resumed}: loss at step {step}", tol=tolerance("float64", layers=1, steps=step))
    saved = sorted(ckpt.read_metadata(d)[1]["step"] for d in (launched / "ck").glob("step_*"))
    assert saved == [SAVED_AT, STEPS]
    assert (launched / "ck" / ckpt.read_metadata(launched / "ck")[0].name / ".metadata").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_deepseek_v3_dcp_checkpoint_resumes_in_another_layout_and_t(launched):
    # saved under expert parallelism at t = 2 (experts dealt out whole), resumed at t = 4 with every
    # rank all tokens, its heads and its experts: the same losses as the run that went on
    uninterrupted, got = losses(launched / "ds-uninterrupted-ep2.jsonl"), losses(launched / "ds-resumed-tp4.jsonl")
    assert sorted(got) == [2, 3], sorted(got)
    for step in (2, 3):
        assert_matches_reference(np.float64(got[step]), np.float64(uninterrupted[step]),
                                 name=f"DeepSeek-V3 resumed: loss at step {step}",
                                 tol=tolerance("float64", layers=2, steps=step))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_uneven_trap_fails_with_from_local_and_passes_with_the_course_writer(launched):
    # 10 rows at t = 4: the course's plan gives 3, 3, 2, 2 (numpy.array_split); DTensor's Shard(0)
    # means torch.chunk's 3, 3, 3, 1. Saved through from_local, the save reports success and the
    # metadata records the chunk sizes DTensor assumes, so the load fails; placed by the plan,
    # every row comes back
    assert not dist.is_initialized()
    full = init_gpt(TRAP, SEED).state_dict()["wte.weight"]
    loaded = {"wte.weight": torch.zeros_like(full)}
    with pytest.raises(CheckpointException, match="mismatch sizes"):   # a BaseException, not an Exception
        torch_dcp.load(loaded, checkpoint_id=launched / "trap-from-local", no_dist=True)
    chunks = torch_dcp.FileSystemReader(launched / "trap-course").read_metadata().state_dict_metadata["wte.weight"].chunks
    assert [(c.offsets[0], c.sizes[0]) for c in chunks] == [(0, 3), (3, 3), (6, 2), (8, 2)]
    loaded = {"wte.weight": torch.zeros_like(full)}
    torch_dcp.load(loaded, checkpoint_id=launched / "trap-course", no_dist=True)
    assert_matches_reference(loaded["wte.weight"], full, name="wte.weight through the course's writer", exact=True)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("t", [1, 2, 3])
def test_a_checkpoint_of_pytorchs_dtensor_model_loads_into_the_courses(launched, t):
    # parallelize_module with the course's DTensor plan at t = 4, state_dict() saved by dcp.save:
    # the course's reader cuts every rank's pieces at t (3: uneven heads of 16 rows) from its chunks
    full = init_gpt(DTENSOR, SEED, torch.float64).state_dict()
    for r in range(t):
        local = dcp.load_shard(launched / "dtensor", {}, DTENSOR, t, r, ckpt.GPT_SHARDING)
        assert set(local["model"]) == set(full)
        for name, value in full.items():
            assert_matches_reference(local["model"][name], shard_tensor(name, value, t, r, DTENSOR),
                                     name=f"{name} from DTensor's checkpoint", rank=r, exact=True)
    # its checkpoint has no meta.json: the course's loaders refuse it, naming it
    with pytest.raises(ckpt.CheckpointError, match="DCP checkpoint without tp_from_scratch's meta.json"):
        ckpt.load_full(launched / "dtensor")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_dtensor_model_loads_a_course_checkpoint(launched):
    # and back: the course's t = 2 checkpoint read by dcp.load into the DTensor model's shards at t = 4
    expected = init_gpt(DTENSOR, SEED + 1, torch.float64).state_dict()
    got = torch.load(launched / "dtensor-loaded.pt", weights_only=True)
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert_matches_reference(got[name], value, name=f"{name} in the DTensor model", exact=True)
