"""The doctor tells a newcomer what works and, for whatever does not, what to do.

Here everything is installed, so the full run must pass. The failures are simulated by
pointing the launcher lookup at an empty directory (no venv, nothing on PATH) or at fake
launchers that crash or hang: each must turn into a [FAIL] line with the fix, never a
traceback and never a hang.
"""
import stat
import sys

import pytest

from tp_from_scratch.comm import launchers
from tp_from_scratch.tools import doctor


@pytest.fixture
def no_launchers(tmp_path, monkeypatch):
    """A machine where neither the venv nor PATH holds mpiexec, torchrun or jupyter."""
    monkeypatch.setattr(launchers, "VENV_BIN", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    return tmp_path


def fake_launcher(directory, name, script):
    """An executable ``name`` in ``directory`` that runs the shell ``script`` instead of launching."""
    path = directory / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_doctor_passes_on_this_machine():
    # the real thing: torchrun + gloo, mpiexec + mpi4py and a jupyter kernel all launched
    proc = launchers.run_command([sys.executable, "-m", "tp_from_scratch.tools.doctor"], timeout=170)
    assert proc.returncode == 0, proc.stdout
    ok_lines = [line for line in proc.stdout.splitlines() if line.startswith("[OK]")]
    assert len(ok_lines) == len(doctor.CHECKS), proc.stdout
    assert "[FAIL]" not in proc.stdout
    assert "6 of 6 checks passed" in proc.stdout


def test_require_launcher_prefers_the_venv_then_path(tmp_path, monkeypatch):
    venv, elsewhere = tmp_path / "venv", tmp_path / "elsewhere"
    venv.mkdir()
    elsewhere.mkdir()
    monkeypatch.setattr(launchers, "VENV_BIN", venv)
    monkeypatch.setenv("PATH", str(elsewhere))
    on_path = fake_launcher(elsewhere, "mpiexec", "exit 0")
    assert launchers.require_launcher("mpiexec") == str(on_path)
    in_venv = fake_launcher(venv, "mpiexec", "exit 0")
    assert launchers.require_launcher("mpiexec") == str(in_venv)
    assert launchers.mpiexec_command(2, "some.module")[0] == str(in_venv)


@pytest.mark.parametrize("name, command", [
    ("mpiexec", lambda: launchers.mpiexec_command(2, "some.module")),
    ("torchrun", lambda: launchers.torchrun_command(2, "some.module")),
])
def test_missing_launcher_error_names_it_and_says_how_to_install(no_launchers, name, command):
    with pytest.raises(launchers.LauncherNotFoundError) as err:
        command()
    message = str(err.value)
    assert message.startswith(f"{name} not found")
    assert str(no_launchers) in message  # where it looked
    assert "pip install" in message and "make test" in message


def test_missing_mpiexec_fails_the_doctor_with_the_fix(no_launchers, capsys):
    assert doctor.main(["--only", "mpi"]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] MPI: mpiexec not found" in out
    assert "pip install mpi4py mpich" in out and "no system MPI needed" in out
    assert "0 of 1 checks passed; fix: MPI" in out


def test_mpi4py_not_installed_is_reported_before_launching(monkeypatch):
    monkeypatch.setattr(doctor, "_installed", lambda module: module != "mpi4py")
    result = doctor.check_mpi()
    assert not result.ok and result.detail == "mpi4py is not installed"
    assert "pip install mpi4py mpich" in result.fix


def test_missing_torchrun_fails_the_gloo_check_with_the_fix(no_launchers, capsys):
    assert doctor.main(["--only", "gloo"]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] gloo: torchrun not found" in out
    assert "torch==2.13.0" in out


def test_missing_jupyter_fails_with_the_fix(no_launchers):
    result = doctor.check_jupyter()
    assert not result.ok
    assert "jupyter not found" in result.detail and "make test" in result.fix


def test_a_launcher_that_crashes_is_reported_with_its_output(no_launchers):
    fake_launcher(no_launchers, "mpiexec", 'echo "fake mpiexec: cannot start the proxy"; exit 3')
    result = doctor.check_mpi()
    assert not result.ok
    assert "exit status 3" in result.detail and "cannot start the proxy" in result.detail
    assert "[FAIL] MPI:" in result.line() and "fix:" in result.line()


def test_gloo_answers_are_read_even_when_the_ranks_print_on_one_line(no_launchers):
    # two ranks writing at once can glue their lines together; both answers must still count
    fake_launcher(no_launchers, "torchrun", 'echo "[rank 1: all_reduce gave 3][rank 0: all_reduce gave 3]"')
    assert doctor.check_gloo().ok
    # ... but one rank's answer is not enough
    fake_launcher(no_launchers, "torchrun", 'echo "[rank 0: all_reduce gave 3]"')
    result = doctor.check_gloo()
    assert not result.ok and "2-rank all-reduce failed (exit status 0)" in result.detail


def test_a_launcher_that_hangs_is_cut_off_by_the_timeout(no_launchers):
    # PATH is empty here, so the fake sleeps through python rather than `sleep`
    fake_launcher(no_launchers, "torchrun",
                  f'echo "waiting for the other rank"; exec {sys.executable} -c "import time; time.sleep(60)"')
    result = doctor.check_gloo(timeout=2)
    assert not result.ok
    assert "did not finish within 2 s" in result.detail and "waiting for the other rank" in result.detail
    assert "GLOO_SOCKET_IFNAME" in result.fix


def test_too_old_python_is_reported(monkeypatch):
    monkeypatch.setattr(doctor, "MIN_PYTHON", (sys.version_info.major + 1, 0))
    result = doctor.check_python()
    assert not result.ok and "older than 3.10" in result.detail


def test_a_crashing_check_becomes_a_fail_line_not_a_traceback(monkeypatch):
    def broken():
        raise OSError("disk on fire")
    monkeypatch.setitem(doctor.CHECKS, "numpy", broken)
    lines = []
    [result] = doctor.run_checks(["numpy"], out=lines.append)
    assert not result.ok and lines == [result.line()]
    assert "OSError: disk on fire" in lines[0]
