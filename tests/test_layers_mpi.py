"""The numpy TP layers under real processes: one mpiexec job per world size checks every layer.

Each job runs `python -m tp_from_scratch.layers.check` on every rank (MPIComm from
comm_from_env, wrapped in spmd_main): the linear pair, MLP, attention (plain, GQA sharded,
GQA replicated, multi-query) and the block, float64 and float32, outputs and all gradients
against the single-device reference, plus the all-reduce counts. Any mismatch raises on
that rank, and spmd_main ends the job with a non-zero status naming the rank.
"""
import pytest

from tp_from_scratch.comm.launchers import mpiexec_command, run_command


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("ranks", [2, 4])
def test_every_layer_matches_reference_under_mpiexec(ranks):
    result = run_command(mpiexec_command(ranks, "tp_from_scratch.layers.check"), timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    for rank in range(ranks):
        assert f"rank {rank} of {ranks}: all " in result.stdout, result.stdout[-3000:]
    assert "tensors match the reference (MPIComm)" in result.stdout
