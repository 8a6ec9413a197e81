"""Is this machine ready for the course? One [OK] or [FAIL] line per tool, each FAIL with a fix.

    .venv/bin/python -m tp_from_scratch.tools.doctor                 # everything (about 10-30 s)
    .venv/bin/python -m tp_from_scratch.tools.doctor --only mpi gloo # just some checks

Checks: Python (>= 3.10), numpy, torch (CUDA is reported, never required), gloo (a 2-rank
all-reduce under torchrun), MPI (a 2-rank hello under the venv's mpiexec) and jupyter (a
kernel that runs a cell). The two launches go through launchers.run_command with a timeout
and a fresh port, so the doctor itself can never hang. Exit status 1 if anything failed.
"""
import argparse
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass

from tp_from_scratch.comm import launchers

SETUP_FIX = "run `make test` (it creates .venv from requirements.txt), or `pip install -r requirements.txt`"
MIN_PYTHON = (3, 10)
MIN_NUMPY = (1, 26)


@dataclass
class CheckResult:
    """One line of the report: a passed check says what it found, a failed one what to do."""

    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self):
        if self.ok:
            return f"[OK]   {self.name}: {self.detail}"
        return f"[FAIL] {self.name}: {self.detail}" + (f"\n       fix: {self.fix}" if self.fix else "")


def _version_tuple(text):
    """'2.13.0+cpu' -> (2, 13); enough to compare against a lower bound."""
    return tuple(int(p) for p in text.split("+")[0].split(".")[:2] if p.isdigit())


def _installed(module):
    """Whether ``module`` can be imported, found without importing it."""
    return importlib.util.find_spec(module) is not None


def _tail(text, lines=6):
    """The last few lines of a launched job's output, indented, for a FAIL message."""
    kept = (text or "").strip().splitlines()[-lines:]
    return "".join(f"\n         | {line}" for line in kept)


def check_python():
    """The interpreter is new enough (3.10: the course uses `X | Y` types and removeprefix)."""
    v = sys.version_info
    found = f"Python {v.major}.{v.minor}.{v.micro} at {sys.executable}"
    if v[:2] < MIN_PYTHON:
        return CheckResult("Python", False, f"{found} is older than 3.10",
                           "install Python 3.10 or newer, then `make test PYTHON=python3.x`")
    return CheckResult("Python", True, found)


def check_numpy():
    """numpy imports and meets the lower bound in requirements.txt."""
    try:
        import numpy
    except ImportError as e:
        return CheckResult("numpy", False, f"not importable ({e})", SETUP_FIX)
    if _version_tuple(numpy.__version__) < MIN_NUMPY:
        return CheckResult("numpy", False, f"numpy {numpy.__version__} is older than 1.26", SETUP_FIX)
    return CheckResult("numpy", True, f"numpy {numpy.__version__}")


def check_torch():
    """torch imports; whether CUDA is usable is information only (the course runs on a CPU)."""
    try:
        import torch
    except ImportError as e:
        return CheckResult("torch", False, f"not importable ({e})", SETUP_FIX + " (torch is pinned to 2.13.0)")
    cuda = (f"CUDA available, {torch.cuda.device_count()} GPU(s)" if torch.cuda.is_available()
            else "CUDA not available: CPU only, which is all the course needs")
    return CheckResult("torch", True, f"torch {torch.__version__} ({cuda})")


def _launch_two_ranks(name, launcher, command, what, ok, hang_fix, timeout):
    """Run a 2-rank worker of this module under ``launcher``; (CompletedProcess, None) if ``ok(stdout)``.

    Otherwise (None, a [FAIL] CheckResult): launcher missing, no answer within ``timeout``
    (the process group is killed), or a wrong answer, each with its fix.
    """
    try:
        cmd = command(2, "tp_from_scratch.tools.doctor", "--worker", name.lower())
    except launchers.LauncherNotFoundError as e:
        return None, CheckResult(name, False, str(e).split(": ", 1)[0], launchers.LAUNCHER_FIX[launcher])
    try:
        proc = launchers.run_command(cmd, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return None, CheckResult(name, False, f"{what} did not finish within {timeout:.0f} s"
                                 + _tail(e.output), hang_fix)
    if proc.returncode != 0 or not ok(proc.stdout):
        return None, CheckResult(name, False, f"{what} failed (exit status {proc.returncode})"
                                 + _tail(proc.stdout), hang_fix)
    return proc, None


def check_gloo(timeout=90.0):
    """2 processes under torchrun join a gloo process group and all-reduce [1] and [2] into [3]."""
    # the ranks print concurrently, so lines may run together: each answer is bracketed
    def ok(stdout):
        return set(re.findall(r"\[rank (\d+): all_reduce gave 3\]", stdout)) == {"0", "1"}

    proc, failed = _launch_two_ranks("gloo", "torchrun", launchers.torchrun_command,
                                     "2-rank all-reduce", ok, _GLOO_HANG_FIX, timeout)
    return failed or CheckResult("gloo", True, "2-rank all-reduce under torchrun gave 3 on both ranks")


_GLOO_HANG_FIX = ("gloo talks TCP on localhost: check that no firewall/VPN blocks it; if the host "
                  "name resolves to an unreachable address, set GLOO_SOCKET_IFNAME=lo (Linux) or lo0 (macOS)")


def check_mpi(timeout=60.0):
    """mpi4py is installed, and 2 processes under mpiexec load MPI, say hello and all-reduce.

    mpi4py is only looked up here, never imported: importing mpi4py.MPI would initialise MPI
    in this process (and in a test session, for every later test).
    """
    if not _installed("mpi4py"):
        return CheckResult("MPI", False, "mpi4py is not installed", launchers.LAUNCHER_FIX["mpiexec"])
    # a missing libmpi shows up as an ImportError in the ranks' output, so as a wrong answer
    proc, failed = _launch_two_ranks("MPI", "mpiexec", launchers.mpiexec_command, "2-rank hello under mpiexec",
                                     lambda out: "hello from ranks [0, 1] of 2, sum 3" in out,
                                     _MPI_HANG_FIX, timeout)
    if failed:
        return failed
    library = re.search(r"MPI library: (.*)", proc.stdout).group(1)
    return CheckResult("MPI", True, f"mpi4py {importlib.metadata.version('mpi4py')} with {library}; "
                       f"2-rank hello under mpiexec")


_MPI_HANG_FIX = ("use the venv's mpiexec (the mpich wheel), not a system one built for another MPI: "
                 + launchers.LAUNCHER_FIX["mpiexec"])


def check_jupyter(timeout=90.0):
    """The jupyter command exists and its python3 kernel starts and runs a cell with numpy."""
    try:
        jupyter = launchers.require_launcher("jupyter")
        import nbclient
        import nbformat
    except (launchers.LauncherNotFoundError, ImportError) as e:
        return CheckResult("jupyter", False, f"not installed ({str(e).split(': ', 1)[0]})", SETUP_FIX)
    code = "import sys, numpy; print(sys.executable)"
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    try:
        client = nbclient.NotebookClient(notebook, timeout=timeout, startup_timeout=timeout, kernel_name="python3")
        client.execute(stderr=subprocess.DEVNULL)  # the kernel's own start-up chatter is not a finding
    except Exception as e:  # no kernel spec, a kernel that dies, or numpy missing in the kernel
        return CheckResult("jupyter", False, f"the python3 kernel could not run a cell ({type(e).__name__}: "
                           f"{str(e).strip().splitlines()[-1] if str(e).strip() else ''})",
                           f"{SETUP_FIX}; then `{sys.executable} -m ipykernel install --user --name python3`")
    kernel_python = notebook.cells[0].outputs[0].get("text", "?").strip()
    return CheckResult("jupyter", True, f"{jupyter}; the python3 kernel runs {kernel_python}")


CHECKS = {
    "python": check_python,
    "numpy": check_numpy,
    "torch": check_torch,
    "gloo": check_gloo,
    "mpi": check_mpi,
    "jupyter": check_jupyter,
}


def run_checks(names=None, out=print):
    """Run the named checks (all by default), print each line as it comes, return the results."""
    results = []
    for name in names or list(CHECKS):
        try:
            result = CHECKS[name]()
        except Exception as e:  # a check must report, never crash the doctor
            result = CheckResult(name, False, f"the check itself crashed: {type(e).__name__}: {e}", SETUP_FIX)
        out(result.line())
        results.append(result)
    return results


# --- what the launched ranks run ------------------------------------------------------------

def _gloo_worker():
    """Under torchrun: all-reduce rank+1 over gloo, with a timeout on every wait."""
    import torch
    import torch.distributed as dist

    from tp_from_scratch.comm.launch import torch_main

    def all_reduce():
        x = torch.tensor([dist.get_rank() + 1.0])
        dist.all_reduce(x)  # 1 + 2 on 2 ranks
        print(f"[rank {dist.get_rank()}: all_reduce gave {x.item():g}]", flush=True)
    torch_main(all_reduce, timeout=30)  # env:// from torchrun, gloo


def _mpi_worker():
    """Under mpiexec: every rank all-reduces rank+1; rank 0 says hello for all (one clean line)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    total = comm.allreduce(comm.Get_rank() + 1)
    ranks = comm.gather(comm.Get_rank(), root=0)
    if comm.Get_rank() == 0:
        library = " ".join(MPI.Get_library_version().split("\n")[0].split())  # "MPICH Version: 5.0.2"
        print(f"MPI library: {library}\nhello from ranks {ranks} of {comm.Get_size()}, sum {total}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=list(CHECKS), help="run only these checks")
    parser.add_argument("--worker", choices=["gloo", "mpi"], help=argparse.SUPPRESS)  # a launched rank
    args = parser.parse_args(argv)
    if args.worker:
        {"gloo": _gloo_worker, "mpi": _mpi_worker}[args.worker]()
        return 0
    results = run_checks(args.only)
    failed = [r.name for r in results if not r.ok]
    print(f"\n{len(results) - len(failed)} of {len(results)} checks passed"
          + (f"; fix: {', '.join(failed)}" if failed else ". Ready for the course."))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
