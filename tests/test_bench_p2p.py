"""Smoke test of the ring-step benchmark (bench p2p) under both launchers.

Benchmarks are not tests: no timing is judged. What is checked is that every way of
sending (bare backend calls, the communicator with and without a header) delivered the
left neighbour's array bit for bit inside the run, and the table's arithmetic.
"""
import json

import pytest

from tests.slow import only_in_test_slow
from tp_from_scratch.bench.common import sizes
from tp_from_scratch.bench.p2p import WAYS, parse_args
from tp_from_scratch.comm.launchers import mpiexec_command, run_command, torchrun_command

MODULE = "tp_from_scratch.bench"
TINY = ["p2p", "--min-bytes", "8", "--max-bytes", "512", "--factor", "8",
        "--steps", "2", "--warmup", "1", "--iters", "2"]


def test_bad_options_are_named():
    with pytest.raises(SystemExit):
        parse_args(["--steps", "0"])


def check_json(path, ranks, backend):
    report = json.loads(path.read_text())
    assert report["ranks"] == ranks and report["backend"].startswith(backend)
    assert [row["size"] for row in report["rows"]] == sizes(8, 512, 8)
    for row in report["rows"]:
        assert all(row[f"{way}_us"] > 0 for way in WAYS)
        assert row["overhead_us"] == pytest.approx(row["no header_us"] - row["bare_us"])
        assert row["header_cost_us"] == pytest.approx(row["header_us"] - row["no header_us"])


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_p2p_bench_under_mpiexec_3_ranks(tmp_path):
    result = run_command(mpiexec_command(3, MODULE, *TINY, "--json", tmp_path / "p.json"), timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "header cost" in result.stdout
    check_json(tmp_path / "p.json", 3, "MPI")


@pytest.mark.slow
@pytest.mark.timeout(200)
# the same benchmark runs under mpiexec above; torchrun's collectives are proven in make test by
# tests/test_collectives_native.py: this smoke test of the torchrun launch is make test-slow's
@only_in_test_slow("a second launcher for a smoke test")
def test_p2p_bench_under_torchrun_2_ranks(tmp_path):
    result = run_command(torchrun_command(2, MODULE, *TINY, "--json", tmp_path / "p.json"), timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    check_json(tmp_path / "p.json", 2, "torch.distributed")
