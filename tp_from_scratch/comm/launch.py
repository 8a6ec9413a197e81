"""Starting a communicator in a launched process, and ending the whole job when one rank fails.

    comm_from_env()   TorchComm under torchrun, MPIComm under mpiexec, else an error saying how
                      to launch.
    spmd_main(fn)     run fn(comm) in a script; on an exception print "rank R failed: ..." and
                      bring every rank down quickly (MPI Abort, or a non-zero exit that makes
                      torchrun stop the others).
    torch_main(run)   the same door for a torch entry point (a trainer, a check, a benchmark):
                      start the default process group (torchrun's, or a world of one), run,
                      one line "rank R: error: ..." for bad input, tear down, exit status.
    refuse(say)       leave with status 2 for bad input found before that door (a command line
                      refused), the message reaching the user under torchrun every time.
"""
import os
import sys
import time
import traceback

from .errors import CollectiveMismatchError, CommError

_MPI_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def launcher_from_env(environ=None):
    """'torchrun', 'mpi' or None, from the variables the launchers set for each process."""
    env = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" in env or all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR")):
        return "torchrun"
    if any(k in env for k in _MPI_RANK_VARS):
        return "mpi"
    return None


def comm_from_env():
    """The communicator for this launched process: TorchComm under torchrun, MPIComm under mpiexec."""
    launcher = launcher_from_env()
    if launcher == "torchrun":
        from .torch_comm import TorchComm
        return TorchComm()
    if launcher == "mpi":
        from .mpi import MPIComm
        return MPIComm()
    raise RuntimeError(
        "no launcher found (neither torchrun's RANK/WORLD_SIZE/MASTER_ADDR nor mpiexec's PMI_RANK"
        " is set). Launch with `.venv/bin/mpiexec -n 4 .venv/bin/python -m <module>` or"
        " `.venv/bin/torchrun --standalone --nproc-per-node 4 -m <module>`, or use tp_from_scratch.comm.run_spmd to"
        " simulate ranks in one process.")


def _finish(comm):
    """Wait, bounded, for the sends in flight and for every rank to be done.

    A rank that leaves early (even with exit status 0) must not end its process while the
    others still wait for its messages: the launcher could then stop them before they name
    it. Waiting here twice as long as any single wait lets them time out first, report
    "waited ... for a message from rank R", and bring the job down.
    """
    comm.close()
    comm.timeout = 2 * comm.timeout
    comm.barrier()
    if launcher_from_env() == "torchrun":
        # tear gloo down while the interpreter is whole: left to finalization, gloo's threads
        # may drop their last Work while Python is torn down, a known way to end in SIGABRT
        # (pytorch/pytorch PR #179291). spmd_main's scripts end here, so nothing needs it after.
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()


def spmd_main(fn):
    """Run ``fn(comm)`` with comm_from_env(); if it raises, report the rank and end the whole job.

    Returns fn's result on success. On failure prints "rank R failed: <traceback>" to stderr
    and, under MPI, calls MPI Abort (mpiexec kills every rank); under torchrun exits with
    status 1, on which torchrun stops the other workers.
    """
    comm = None
    try:
        comm = comm_from_env()
        try:
            result = fn(comm)
        except SystemExit as leaving:
            if leaving.code not in (0, None):
                raise
            _finish(comm)  # a quiet sys.exit(0) still meets the others at the finish line
            raise
        _finish(comm)
        return result
    except BaseException as error:  # noqa: BLE001 - any failure must end the whole job
        if isinstance(error, SystemExit) and error.code in (0, None):
            raise
        rank = "?" if comm is None else comm.rank
        if isinstance(error, CommError) and not isinstance(error, CollectiveMismatchError):
            # a peer is gone or silent: the message says which; this rank's traceback is noise
            sys.stderr.write(f"rank {rank} failed: {type(error).__name__}: {error}\n")
        else:
            sys.stderr.write(f"rank {rank} failed: {traceback.format_exc()}")
        sys.stderr.flush()
        sys.stdout.flush()
        if comm is not None and hasattr(comm, "abort"):
            comm.abort(1)
        os._exit(1)  # skip atexit handlers that could wait on dead peers


def check_main(report, world_sizes=(1, 2, 3, 4)):
    """The main of a check script: ``report(comm)`` on every rank when launched by mpiexec or
    torchrun; started by plain ``python``, on simulated ranks for each of ``world_sizes``."""
    if launcher_from_env() is not None:
        spmd_main(report)
        return
    from .simulated import run_spmd
    for t in world_sizes:
        run_spmd(report, t)


REFUSAL_WAIT_S = 60   # how long a rank other than 0 waits for rank 0 to print a refusal and leave


def refuse(say, wait_s=REFUSAL_WAIT_S):
    """Leave with status 2 for bad input found before any process-group work; ``say()`` prints
    the refusal (argparse's usage and its one line).

    Every rank reads the same command line, so every rank finds the same problem, but one line
    is enough: rank 0 says it. Under torchrun a rank that left at once would lose it: torchrun
    stops the other workers as soon as one exits with an error, and rank 0 (slower to import,
    say) could be stopped before it printed, leaving the user only torchrun's summary. So every
    other rank waits instead, and torchrun stops it once rank 0 has printed and left; should it
    still run ``wait_s`` seconds later (rank 0 much slower, or rank 0 saw no problem), it says
    the refusal itself. Outside torchrun (plain python; RANK alone set, as in a test) the other
    ranks leave silently.
    """
    rank = int(os.environ.get("RANK", "0"))
    if rank != 0:
        if launcher_from_env() != "torchrun":
            sys.exit(2)
        time.sleep(wait_s)
    say()
    sys.stderr.flush()
    sys.exit(2)


def torch_main(run, device="cpu", timeout=None, errors=(), quick_exit=False):
    """The main of a torch.distributed entry point: start the default process group (torchrun's,
    or a world of one under plain ``python -m``), ``status = run()``, destroy the group, and exit
    with the status (None counts as 0).

    errors: the exception types that are bad input met once work began (a checkpoint, a model
    file): one line ``rank R: error: <message>`` on stderr and status 1. Any other exception is
    ``rank R failed: <traceback>`` and status 1 at once, so torchrun stops the other ranks; in
    a world of one (no launcher) it propagates as usual. quick_exit: under torchrun, leave
    without the interpreter's teardown (process_group.exit_now), where gloo's threads can abort
    a job that has finished (seen with DTensor's device meshes).
    """
    import torch.distributed as dist

    from .process_group import exit_now, init_process_group
    init_process_group(device, timeout)
    rank = dist.get_rank()
    try:
        status = run()
    except errors as error:
        sys.stderr.write(f"rank {rank}: error: {error}\n")
        status = 1
    except SystemExit:  # run's own exit status
        dist.destroy_process_group()
        raise
    except BaseException:  # noqa: BLE001 - any failure must end the whole job
        if launcher_from_env() is None:
            dist.destroy_process_group()
            raise
        sys.stderr.write(f"rank {rank} failed: {traceback.format_exc()}")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)  # a peer may wait in a collective: no teardown that could wait for it
    dist.destroy_process_group()
    if quick_exit and launcher_from_env() is not None:
        exit_now(status or 0)
    sys.exit(status or 0)
