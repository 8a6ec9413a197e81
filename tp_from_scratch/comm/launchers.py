"""Launching ranks as processes: torchrun and mpiexec command lines, free ports, bounded waits.

Launchers never use a fixed port (``free_port`` asks the OS) and never wait without a
timeout (``run_command`` kills the whole process group when time is up).
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

VENV_BIN = Path(sys.executable).parent  # mpiexec from the mpich wheel lives beside python


def free_port():
    """A TCP port on localhost that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env(**extra):
    """The environment for a launched rank: one BLAS thread per rank, the venv first on PATH."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{Path(__file__).resolve().parents[2]}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_command(cmd, timeout, env=None, cwd=None):
    """Run ``cmd`` (a list) and return the CompletedProcess; kill its whole process group on timeout.

    Raises subprocess.TimeoutExpired (with the output so far) when ``timeout`` seconds pass.
    """
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env or subprocess_env(), cwd=cwd, start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, output=out)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, None)


def torchrun_command(nproc, module, *args, nnodes=1, node_rank=0, port=None):
    """The argv for ``torchrun`` on localhost with a fresh port, running ``python -m module args``."""
    port = port or free_port()
    return [
        require_launcher("torchrun"), f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
        f"--node-rank={node_rank}", "--master-addr=127.0.0.1", f"--master-port={port}",
        "-m", module, *map(str, args),
    ]


def mpiexec_command(nproc, module, *args):
    """The argv for ``mpiexec -n nproc python -m module args`` with the venv's mpiexec."""
    return [require_launcher("mpiexec"), "-n", str(nproc), sys.executable, "-m", module, *map(str, args)]


# What to do when a launcher is missing (shown by require_launcher, doctor and the demos).
LAUNCHER_FIX = {
    "mpiexec": "pip install mpi4py mpich (the mpich wheel puts mpiexec inside the venv; "
               "no system MPI needed), or run `make test`, which sets up .venv",
    "torchrun": "pip install torch==2.13.0 (torchrun comes with torch), "
                "or run `make test`, which sets up .venv",
}


class LauncherNotFoundError(RuntimeError):
    """A process launcher (mpiexec, torchrun) is not installed; the message says how to get it."""


def require_launcher(name):
    """Path of the launcher ``name``: the venv's copy first, then PATH; a clear error otherwise.

    The venv comes first because its mpiexec matches the MPI that mpi4py was built with.
    Raises LauncherNotFoundError("mpiexec not found (...): pip install ...").
    """
    beside_python = VENV_BIN / name
    if beside_python.is_file() and os.access(beside_python, os.X_OK):
        return str(beside_python)
    on_path = shutil.which(name)
    if on_path:
        return on_path
    fix = LAUNCHER_FIX.get(name, f"install {name} and put it on PATH")
    raise LauncherNotFoundError(f"{name} not found (looked in {VENV_BIN} and on PATH): {fix}")
