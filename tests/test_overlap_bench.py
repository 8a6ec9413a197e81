"""Smoke tests of Lesson 10's two benchmarks: one tiny launch each, the tables print.

Benchmarks are not tests: nothing here looks at a time. What is checked is that one
invocation prints every row it promises (each algorithm beside native, and the selector's
rules; blocking and overlapped backward, fused and un-fused collective matmul for the process
group and the communicator) and writes its JSON. Both benchmarks compare their results
(bit for bit, or within the tolerance policy) inside the run before timing.
"""
import json
import re

import pytest

from tests.slow import only_in_test_slow
from tp_from_scratch.comm.launchers import mpiexec_command, run_command, torchrun_command

MODULE = "tp_from_scratch.bench"


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_bench_algorithms_prints_the_table_under_mpiexec(tmp_path):
    out = tmp_path / "algorithms.json"
    result = run_command(mpiexec_command(2, MODULE, "algorithms", "--min-bytes", "8", "--max-bytes", "512",
                                         "--factor", "8", "--warmup", "0", "--iters", "1", "--json", out),
                         timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    sizes = [int(m) for m in re.findall(r"^\s+(\d+)(?:\s+\d+\.\d+){5}\s+\w+\s+\d+\.\d+$", result.stdout, re.M)]
    assert sizes == [8, 64, 512], result.stdout
    assert "selector's rules" in result.stdout and "beyond" in result.stdout, result.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [row["size"] for row in rows] == [8, 64, 512]


@pytest.mark.slow
@pytest.mark.timeout(150)
# a benchmark's smoke test; Lesson 10's overlap checks run under torchrun in make test (tests/test_overlap.py)
@only_in_test_slow("a benchmark's smoke test under a second launcher")
def test_bench_overlap_prints_both_tables_under_torchrun(tmp_path):
    out = tmp_path / "overlap.json"
    result = run_command(torchrun_command(2, MODULE, "overlap", "--tokens", "10", "--hidden", "8", "--out", "4",
                                          "--warmup", "0", "--iters", "1", "--json", out), timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    for group in ("native (gloo)", "scratch (TorchComm)"):
        for variant in ("blocking", "overlap"):
            assert re.search(rf"{re.escape(group)}\s+{variant}(\s+-?\d+\.\d+){{3}}", result.stdout), result.stdout
        for op in ("all-gather->matmul", "matmul->reduce-scatter"):
            for variant in ("un-fused", "fused"):
                assert re.search(rf"{re.escape(group)}\s+{re.escape(op)}\s+{variant}(\s+-?\d+\.\d+){{3}}",
                                 result.stdout), result.stdout
    rows = json.loads(out.read_text())["rows"]
    assert sorted({row["technique"] for row in rows}) == ["collective matmul", "overlap in backward"]
    assert len(rows) == 12
