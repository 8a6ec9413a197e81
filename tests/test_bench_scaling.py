"""bench scaling runs end to end (a smoke test: benchmarks are not tests, so no time is asserted).

Under mpiexec the TP run's group is an MPIComm (our ring all-reduce over MPI point-to-point);
the JSON it writes is what Lesson 9 reads: every run's step times, and the speedups derived
from them.
"""
import json

import pytest

from tests.slow import only_in_test_slow
from tp_from_scratch.comm.launchers import mpiexec_command, run_command


@pytest.mark.slow
@pytest.mark.timeout(120)
# a benchmark's smoke test (`make measurements` runs the benchmark itself); its Comm and trainer
# are proven under mpiexec in make test (tests/test_parallelisms.py, tests/test_collectives_native.py)
@only_in_test_slow("a benchmark's smoke test")
def test_bench_scaling_under_mpiexec_writes_every_run(tmp_path):
    out = tmp_path / "scaling.json"
    cmd = mpiexec_command(2, "tp_from_scratch.bench", "scaling", "--sizes", "32,64", "--layers", 1,
                          "--seq-len", 16, "--vocab-size", 64, "--batch-size", 2, "--rounds", 2,
                          "--steps-per-round", 1, "--warmup", 1, "--profile", tmp_path / "none.json",
                          "--json", out)
    result = run_command(cmd, timeout=100)
    assert result.returncode == 0, result.stdout[-3000:]
    report = json.loads(out.read_text())
    assert report["all_reduce"] == "mpi" and report["command"].startswith(".venv/bin/mpiexec -n 2")
    assert [row["hidden"] for row in report["rows"]] == [32, 64]
    for row in report["rows"]:
        assert set(row["times_s"]) == {"tp1-1thread", "tp1-2threads", "tp2"}
        assert all(len(times) == 2 and min(times) > 0 for times in row["times_s"].values())
        assert row["speedup_vs_1thread"] == pytest.approx(row["min_s"]["tp1-1thread"] / row["min_s"]["tp2"])
        assert row["predicted_s"] == dict.fromkeys(row["times_s"])  # no profile: no prediction
