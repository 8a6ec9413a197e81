"""The one place a torch.distributed process group is created: always with a timeout.

    init_process_group(device)   the default group: gloo on CPU, nccl for "cuda" (one GPU per
                                 process, LOCAL_RANK's); from torchrun's environment, or a
                                 world of one process when there is none
    new_group(ranks)             a sub-group (a TP or DP group of a mesh), same timeout
    local_device(device)         this process's torch.device: the CPU, or LOCAL_RANK's GPU
    exit_now(code)               leave a worker whose groups are destroyed, skipping the
                                 interpreter's teardown (where gloo's threads can abort it)

The timeout is the ``timeout`` argument in seconds, else TP_TIMEOUT, else 30 s: a collective
that a peer never joins fails with an error instead of waiting forever. Used by the
communicators (comm/torch_comm.py) and every torch entry point (comm/launch.py's torch_main).
"""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from .base import timeout_from_env
from .launchers import free_port


def _timedelta(timeout):
    return timedelta(seconds=timeout_from_env() if timeout is None else float(timeout))


def backend_for(device):
    """"nccl" for a CUDA device, "gloo" otherwise."""
    return "nccl" if device is not None and torch.device(device).type == "cuda" else "gloo"


def init_process_group(device="cpu", timeout=None):
    """Start the default process group (once; later calls do nothing) and return its backend.

    Launched by torchrun (RANK set): env:// rendezvous. Otherwise a world of one process on a
    free localhost port, so ``python -m ...`` runs the same code as a 1-rank job.
    """
    if dist.is_initialized():
        return dist.get_backend()
    backend = backend_for(device)
    if backend == "nccl":
        torch.cuda.set_device(local_device("cuda"))
    if "RANK" in os.environ:
        dist.init_process_group(backend, timeout=_timedelta(timeout))
    else:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}",
                                rank=0, world_size=1, timeout=_timedelta(timeout))
    return backend


def local_device(device="cpu"):
    """torch.device("cpu"), or for "cuda" the GPU of this process (torchrun's LOCAL_RANK; one per process)."""
    if device is not None and torch.device(device).type == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def new_group(ranks, timeout=None):
    """A process group of ``ranks`` (global ranks). Collective: every rank calls it, same order."""
    return dist.new_group(list(ranks), timeout=_timedelta(timeout))


def exit_now(code):
    """End this torchrun worker with ``code`` once its results are out and its process groups
    destroyed: flush, then leave without the interpreter's own teardown. There, gloo's threads
    (those of a DTensor device mesh among them) can still end the process with SIGABRT
    ("terminate called without an active exception") after everything was checked and printed,
    which torchrun then reports as a failed job; seen in full test runs of the DTensor demo."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
