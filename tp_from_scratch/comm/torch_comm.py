"""TorchComm: the communicator over torch.distributed, for scripts launched with torchrun.

gloo on CPU, nccl when the communicator's device is CUDA. Arrays in and out are numpy;
they travel as torch tensors on ``comm.device``. A message is a fixed-size int64 header
(ndim, dtype code, shape) followed by the payload (skipped when empty), or the payload
alone when sent with header=False; all go out with isend so a ring step cannot
deadlock. Every wait has a deadline (TP_TIMEOUT, default 30 s)
and the process group itself is created with that timeout.
"""
import os
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from .base import TAG_DATA, Comm, debug_from_env, timeout_from_env
from .errors import CommError, CommTimeoutError
from .process_group import init_process_group

# dtype code in the header <-> numpy dtype
DTYPES = [np.dtype(t) for t in ("float64", "float32", "float16", "int64", "int32", "int16",
                                "int8", "uint8", "bool", "complex64", "complex128")]
MAX_DIMS = 8
HEADER = 2 + MAX_DIMS  # (ndim, dtype code, d0 .. d7)
# A message's header travels on wire tag WIRE_TAGS + 2*tag, its payload on WIRE_TAGS + 2*tag + 1.
# The offset keeps our tags clear of the ones gloo draws from its collective counter for its
# own point-to-point messages (monitored_barrier), which start at 0.
WIRE_TAGS = 1 << 20


def _wire_tag(tag, payload):
    return WIRE_TAGS + 2 * tag + int(payload)


def init_process_group_from_env(device=None, timeout=None):
    """Initialise the default process group from torchrun's environment, with a timeout.

    Backend: nccl for a CUDA device (each process uses cuda:LOCAL_RANK), gloo otherwise.
    Does nothing if a process group already exists (see comm/process_group.py).
    """
    init_process_group(device, timeout)


class TorchComm(Comm):
    """Communicator over a torch.distributed process group (default: the world group)."""

    def __init__(self, group=None, device=None, timeout=None, debug=None):
        self.timeout = timeout_from_env() if timeout is None else float(timeout)
        init_process_group_from_env(device, self.timeout)
        self.group = group
        super().__init__(dist.get_rank(group), dist.get_world_size(group))
        if device is None:
            nccl = dist.get_backend(group) == "nccl"
            device = torch.device("cuda", torch.cuda.current_device()) if nccl else "cpu"
        self.device = torch.device(device)
        self.debug = debug_from_env() if debug is None else bool(debug)
        self._pending = []  # (work, tensor) of sends that may still be in flight

    def _peer(self, rank):
        # torch.distributed addresses peers by their rank in the world group
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def _wait(self, work, what, peer=None):
        try:
            finished = work.wait(timeout=timedelta(seconds=self.timeout))
        except RuntimeError as error:  # gloo reports a timeout or a dead peer this way
            if "timeout" in str(error).lower() or "timed out" in str(error).lower():
                raise CommTimeoutError(f"{self._timeout_message(what, peer)} ({error})") from None
            lost = f"; rank {peer} may have failed or exited" if peer is not None else ""
            raise CommError(f"rank {self.rank}: waiting for {what} failed{lost}: {error}") from None
        if finished is False:
            raise CommTimeoutError(self._timeout_message(what, peer))

    def _raw_send(self, array, dst, tag, header=True):
        array = np.asarray(array)
        if (header and array.ndim > MAX_DIMS) or array.dtype not in DTYPES:
            raise ValueError(f"rank {self.rank}: TorchComm cannot send an array of shape "
                             f"{array.shape} and dtype {array.dtype} (at most {MAX_DIMS} dims, "
                             f"dtypes {[d.name for d in DTYPES]})")
        tensors = []  # (tensor, tag) in the order they go out
        if header:
            head = torch.zeros(HEADER, dtype=torch.int64)
            head[0], head[1] = array.ndim, DTYPES.index(array.dtype)
            head[2:2 + array.ndim] = torch.tensor(array.shape, dtype=torch.int64)
            tensors.append((head.to(self.device), _wire_tag(tag, payload=False)))
        # a plain send copies: the caller may overwrite its array once send returns. Inside
        # a collective the buffers stay untouched until _collective_done waits for the sends.
        inside = self.meter.current is not None and tag == TAG_DATA
        if array.size:
            data = np.ascontiguousarray(array) if inside else np.array(array, copy=True, order="C")
            tensors.append((torch.from_numpy(data).to(self.device), _wire_tag(tag, payload=True)))
        for tensor, channel in tensors:
            self._pending.append((dist.isend(tensor, self._peer(dst), self.group, tag=channel), tensor))
        self._pending = [(w, t) for w, t in self._pending if not w.is_completed()]

    def _raw_recv(self, src, tag, out=None, header=True):
        what = f"a message from rank {src}"
        if header:
            head = torch.empty(HEADER, dtype=torch.int64, device=self.device)
            self._wait(dist.irecv(head, self._peer(src), self.group, tag=_wire_tag(tag, payload=False)), what, src)
            head = head.cpu().tolist()
            ndim, dtype = head[0], DTYPES[head[1]]
            shape = tuple(head[2:2 + ndim])
            self._check_out(out, shape, dtype, src)
        else:  # the caller's buffer says what arrives. Unchecked here: gloo aborts on a longer
            # message but accepts a shorter one, nccl checks nothing (see Comm.send)
            shape, dtype = out.shape, out.dtype
        # on the CPU, a contiguous ``out`` is received into directly (torch shares its memory)
        direct = out is not None and out.flags.c_contiguous and self.device.type == "cpu"
        data = torch.from_numpy(out if direct else np.empty(shape, dtype=dtype)).to(self.device)
        if data.numel():
            self._wait(dist.irecv(data, self._peer(src), self.group, tag=_wire_tag(tag, payload=True)), what, src)
        if direct:
            return out
        if out is not None:
            np.copyto(out, data.cpu().numpy())
            return out
        return data.cpu().numpy()

    def _raw_irecv(self, src, tag, out):
        # posted now: gloo's own threads move the bytes while this rank computes
        direct = out.flags.c_contiguous and self.device.type == "cpu"
        data = torch.from_numpy(out if direct else np.empty(out.shape, out.dtype)).to(self.device)
        if not data.numel():  # an empty payload is never sent (see _raw_send)
            return (lambda: True), (lambda: None)
        work = dist.irecv(data, self._peer(src), self.group, tag=_wire_tag(tag, payload=True))

        def finish():
            if not direct:
                np.copyto(out, data.cpu().numpy())

        def test():
            if not work.is_completed():
                return False
            self._wait(work, f"a message from rank {src}", src)  # raises if it failed
            finish()
            return True

        def wait():
            self._wait(work, f"a message from rank {src}", src)
            finish()

        return test, wait

    def barrier(self):
        """Wait until every rank reaches the barrier (at most TP_TIMEOUT seconds)."""
        if dist.get_backend(self.group) == "gloo":
            # names the ranks that did not arrive
            dist.monitored_barrier(self.group, timeout=timedelta(seconds=self.timeout))
        else:
            dist.barrier(self.group)  # nccl: bounded by the process group's timeout

    def _collective_done(self):
        self.close()

    def close(self):
        """Wait (bounded) for sends in flight."""
        for work, _ in self._pending:
            self._wait(work, "its sent messages to be received")
        self._pending = []

    def abort(self, code=1):
        """Exit this process with ``code`` at once; torchrun then stops the other workers."""
        os._exit(code)
