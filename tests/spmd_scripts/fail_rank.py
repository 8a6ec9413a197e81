"""A job in which rank 1 misbehaves, to prove the whole job ends quickly and names it.

    mpiexec -n 3 python -m tests.spmd_scripts.fail_rank MODE
    torchrun --nproc-per-node 3 -m tests.spmd_scripts.fail_rank MODE

MODE: raise     rank 1 raises ValueError
      exit      rank 1 leaves (exit status 0) without joining the next collective
      kill      rank 1 is killed with SIGKILL
      mismatch  rank 1 calls all_gather while the others call all_reduce (run with TP_DEBUG=1)
      ok        nobody misbehaves
The other ranks keep calling all_reduce; they must not hang (run with a small TP_TIMEOUT).
"""
import os
import signal
import sys

import numpy as np

from tp_from_scratch import collectives as C
from tp_from_scratch.comm import spmd_main


def main(comm, mode):
    x = np.ones(5)
    C.all_reduce(comm, x)  # every rank is up and connected
    if comm.rank == 1:
        if mode == "raise":
            raise ValueError("rank 1 fails on purpose")
        if mode == "exit":
            sys.exit(0)
        if mode == "kill":
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "mismatch":
            C.all_gather(comm, x)
    for _ in range(3):
        C.all_reduce(comm, x)
    print(f"rank {comm.rank}: finished", flush=True)


if __name__ == "__main__":
    spmd_main(lambda comm: main(comm, sys.argv[1]))
