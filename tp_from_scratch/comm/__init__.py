"""Communicators: the same SPMD code on simulated ranks, under mpiexec, or under torchrun.

    from tp_from_scratch.comm import run_spmd
    run_spmd(fn, 4)                 # fn(comm) on 4 threads; returns the 4 results

    # in a script launched by `.venv/bin/mpiexec -n 4 .venv/bin/python script.py` or `.venv/bin/torchrun --standalone --nproc-per-node 4 script.py`
    from tp_from_scratch.comm import spmd_main
    spmd_main(fn)                   # fn(comm_from_env()); a failing rank brings the job down

Every communicator has ``rank``, ``world_size``, ``send(array, dst, header=True)``,
``recv(src, out=None, header=True)``, ``barrier()`` and a ``meter``. Arrays are numpy arrays.
A message carries its shape and dtype unless both sides pass ``header=False`` (the receiver
then gives ``out=``, as MPI and torch.distributed receivers always do).

When something goes wrong (TP_TIMEOUT=seconds bounds every wait, default 30; TP_DEBUG=1
checks collectives across processes):

    simulator   SPMDError in the caller: "deadlock: rank 0 waits for a message from rank 1; ...",
                "collective mismatch ...: rank 2 is in all_reduce, rank 0 is in all_gather",
                "rank 2 failed: ValueError: ..." with that rank's traceback
    mpiexec     "rank R failed: ..." then MPI Abort ends every rank; a rank waiting on a
                vanished peer gives up after TP_TIMEOUT naming it; a killed rank makes
                mpiexec report "BAD TERMINATION ... EXIT CODE: 9" and stop the rest
    torchrun    "rank R failed: ..." then exit 1, and torchrun stops the other workers;
                gloo notices a vanished peer at once ("connection closed/reset")
"""
from .base import Comm, Fingerprint, debug_from_env, timeout_from_env
from .errors import (CollectiveMismatchError, CommError, CommTimeoutError, DeadlockError,
                     SPMDError)
from .meter import Meter, Traffic
from .simulated import SimulatedComm, run_spmd
from .launch import comm_from_env, spmd_main, torch_main


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
    "comm_from_env", "spmd_main", "torch_main", "SPMDError", "CommError", "DeadlockError",
    "CommTimeoutError", "CollectiveMismatchError", "Fingerprint", "timeout_from_env",
    "debug_from_env",
]
