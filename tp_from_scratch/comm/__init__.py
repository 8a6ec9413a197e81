"""Communicators: the same SPMD code on simulated ranks, under mpiexec, or under torchrun.

    from tp_from_scratch.comm import run_spmd
    run_spmd(fn, 4)                 # fn(comm) on 4 threads; returns the 4 results

    # in a script launched by `mpiexec -n 4 python script.py` or `torchrun --nproc-per-node 4 script.py`
    from tp_from_scratch.comm import spmd_main
    spmd_main(fn)                   # fn(comm_from_env()); a failing rank brings the job down

Every communicator has ``rank``, ``world_size``, ``send(array, dst)``, ``recv(src)``,
``barrier()`` and a ``meter``. Arrays are numpy arrays.
"""
from .base import Comm, Fingerprint, debug_from_env, timeout_from_env
from .errors import (CollectiveMismatchError, CommError, CommTimeoutError, DeadlockError,
                     SPMDError)
from .meter import Meter, Traffic
from .simulated import SimulatedComm, run_spmd
from .launch import comm_from_env, spmd_main


def __getattr__(name):
    # MPIComm and TorchComm import mpi4py / torch only when asked for: importing mpi4py
    # initialises MPI, which must not happen in a plain `python` process.
    if name == "MPIComm":
        from .mpi import MPIComm
        return MPIComm
    if name == "TorchComm":
        from .torch_comm import TorchComm
        return TorchComm
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Comm", "Meter", "Traffic", "SimulatedComm", "MPIComm", "TorchComm", "run_spmd",
    "comm_from_env", "spmd_main", "SPMDError", "CommError", "DeadlockError",
    "CommTimeoutError", "CollectiveMismatchError", "Fingerprint", "timeout_from_env",
    "debug_from_env",
]
