"""Smoke test of the collectives benchmark: it runs under both launchers and writes its JSON.

Benchmarks are not tests: nothing here looks at a timing. What is checked is the table's
arithmetic (sizes, busbw factors) and that a tiny run produces one row per op and size,
with the from-scratch and native results compared inside the run.
"""
import json

import pytest

from tests.slow import only_in_test_slow
from tp_from_scratch.bench.collectives import OPS, bus_factor, element_count
from tp_from_scratch.bench.common import parse_bytes, sizes
from tp_from_scratch.comm.launchers import mpiexec_command, run_command, torchrun_command

MODULE = "tp_from_scratch.bench"


def test_sizes_run_from_min_to_max_inclusive():
    assert sizes(8, 16 * 2 ** 20, 4)[:3] == [8, 32, 128]
    assert sizes(8, 16 * 2 ** 20, 4)[-2:] == [8 * 2 ** 20, 16 * 2 ** 20]
    assert sizes(64, 64, 2) == [64]


def test_parse_bytes_understands_suffixes():
    assert [parse_bytes(s) for s in ["8", "64K", "16M", "1G", "2MB"]] == [8, 2 ** 16, 2 ** 24, 2 ** 30, 2 ** 21]


def test_bus_factor_is_the_rings_share_of_the_array():
    # nccl-tests' convention: busbw = algbw x 2(p-1)/p for all_reduce, (p-1)/p for the others
    assert bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert bus_factor("reduce_scatter", 2) == pytest.approx(0.5)
    assert bus_factor("all_reduce", 1) == 0


def test_even_shards_where_the_native_collective_needs_them():
    assert element_count("all_reduce", 8, 4, 4) == 2
    assert element_count("all_gather", 8, 4, 4) == 4      # at least one element per rank
    assert element_count("reduce_scatter", 1000, 3, 4) == 249  # 250 rounded down to 3 x 83


def check_json(path, ranks, backend):
    report = json.loads(path.read_text())
    assert report["ranks"] == ranks and report["backend"].startswith(backend)
    rows = report["rows"]
    assert sorted({(r["op"], r["size"]) for r in rows}) == sorted(
        (op, element_count(op, size, ranks, 4) * 4) for op in OPS for size in [8, 64])
    for row in rows:
        for who in ("scratch", "native"):
            assert row[f"{who}_time_us"] > 0
            assert row[f"{who}_busbw"] == pytest.approx(row[f"{who}_algbw"] * bus_factor(row["op"], ranks))
        assert row["ratio"] == pytest.approx(row["scratch_busbw"] / row["native_busbw"])


TINY = ["collectives", "--min-bytes", "8", "--max-bytes", "64", "--factor", "8", "--warmup", "1", "--iters", "2"]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_bench_under_mpiexec_2_ranks(tmp_path):
    result = run_command(mpiexec_command(2, MODULE, *TINY, "--json", tmp_path / "b.json"), timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "busbw" in result.stdout and "all_reduce" in result.stdout
    check_json(tmp_path / "b.json", 2, "MPI")


@pytest.mark.slow
@pytest.mark.timeout(200)
# the same benchmark runs under mpiexec above; torchrun's collectives are proven in make test by
# tests/test_collectives_native.py: this smoke test of the torchrun launch is make test-slow's
@only_in_test_slow("a second launcher for a smoke test")
def test_bench_under_torchrun_2_ranks(tmp_path):
    result = run_command(torchrun_command(2, MODULE, *TINY, "--json", tmp_path / "b.json"), timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    check_json(tmp_path / "b.json", 2, "torch.distributed")
