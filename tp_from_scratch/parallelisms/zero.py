"""ZeRO-1 and ZeRO-2 from scratch: the optimizer state sharded over the data-parallel group.

Rajbhandari et al. (2020), "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", observe that every DP rank keeps the same optimizer state (AdamW: two numbers per
parameter, m and v; three with fp32 master weights) although each rank could update just
1/dp of the parameters and share the result. With N parameters (local to this TP rank /
pipeline stage), flattened in parameter order and cut into dp chunks of S = ceil(N/dp)
(the last ones shorter or empty: uneven N is fine), DP rank r owns elements [r*S, (r+1)*S):

    ZeRO-1 = the paper's P_os (optimizer state sharded)
        reduce-scatter the flat gradient           rank r receives only the average of its chunk
        AdamW on elements [r*S, (r+1)*S)           it updates only its chunk ...
        all-gather the chunks (S each)             ... and everyone gets every updated parameter
    ZeRO-2 = P_os+g (optimizer state and gradients sharded)
        the same three steps; the full gradient is dropped after the reduce-scatter

A ring all-reduce is a reduce-scatter followed by an all-gather (Lesson 2), so both send what
DDP sends, 2 (dp-1)/dp N per rank (with dp*S - N <= dp-1 elements of padding): the gradients
go round once, reduced, and the parameters come back instead of the reduced gradients. The two
stages differ in memory only: ZeRO-1 keeps every parameter's .grad (the local, un-averaged
gradient backward wrote), ZeRO-2 frees it.

The naive first version, ``gradient_reduce="all_reduce"``: all-reduce the whole gradient, then
use 1/dp of it. That is how one writes ZeRO-1 first, and how DeepSpeed first shipped it; it
sends 1.5x DDP's bytes (the all-reduce alone is DDP's 2 (dp-1)/dp N, the all-gather adds
(dp-1)/dp N more), for nothing: each rank throws away (dp-1)/dp of the average it received.
DeepSpeed's later "ZeRO stage 1 with reduced communication" moved to the partition-aware
reduce: 1.5x -> 1x.

This ZeRO-2 reduce-scatters once, after backward, so the full gradient still exists for a
moment at the end of backward; DeepSpeed reduce-scatters bucket by bucket during backward and
frees each, never holding all of it. (ZeRO-3 = FSDP also shards the weights and gathers each
layer just in time; not built here.)

Bytes on the wire: on a tp_from_scratch Comm the ring reduce-scatter really sends (dp-1) S per
rank (its Meter counts the messages). On a torch ProcessGroup, gloo has no native
reduce-scatter and emulates reduce_scatter_single with an all-reduce: it moves twice the
bytes; count ZeRO's true bytes on a Comm.

The update itself is any element-wise optimizer (gpt/optim.py's AdamW by default) run on the
rank's chunk as one flat tensor: AdamW treats every element alike, so updating a slice is the
same arithmetic as updating the whole, and the parameters after every step equal unsharded
AdamW's (checked in tests/test_parallelisms.py).

``group`` (first argument, as everywhere in this course) is the DP group: a torch
ProcessGroup (native collectives) or a tp_from_scratch Comm (the from-scratch ring
collectives, e.g. run_spmd's simulated ranks).
"""
import torch
import torch.nn.functional as F

from tp_from_scratch.gpt import optim
from tp_from_scratch.nn.mappings import all_gather, all_reduce, tp_rank, tp_world_size
from tp_from_scratch.sequence_parallel.nn import reduce_scatter


def chunk_bounds(numel, dp, rank):
    """(start, stop) of DP rank ``rank``'s elements when ``numel`` are cut into chunks of ceil(numel/dp).

    The last ranks' chunks may be shorter, even empty (numel < dp); padded to the chunk size on
    the wire so that every rank hands the collectives equal pieces.
    """
    size = -(-numel // dp)
    start = min(numel, rank * size)
    return start, min(numel, start + size)


def tensor_bytes(tensors):
    """Bytes of the tensors in an iterable (None entries count 0)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class ZeroOptimizer:
    """An optimizer whose state lives in 1/dp pieces over the DP group ``group``.

    params: this rank's parameters (the same shapes, in the same order, on every DP rank).
    stage: 1 (optimizer state sharded) or 2 (the gradients too: .grad is freed after the reduce).
    gradient_reduce: "reduce_scatter" (the paper's, DDP's bytes) or "all_reduce" (the naive
        first version: the full average on every rank, 1.5x DDP's bytes).
    make_inner: builds the element-wise optimizer for one flat tensor, e.g.
        ``lambda ps: optim.AdamW(ps, lr=3e-3)`` (the default: gpt/optim.py's AdamW, torch's defaults).

    Use it like a torch optimizer: ``zero_grad()``, backward, ``step()``. ``step`` is
    collective over ``group``: one reduce-scatter (or, naive, all-reduce) of the gradients, then
    one all-gather of the updated parameters.
    """

    def __init__(self, group, params, stage=1, make_inner=None, gradient_reduce="reduce_scatter"):
        self.group, self.stage, self.gradient_reduce = group, stage, gradient_reduce
        self.dp, self.rank = tp_world_size(group), tp_rank(group)
        if stage not in (1, 2):
            raise ValueError(f"DP rank {self.rank}: ZeRO stage must be 1 or 2, got {stage}")
        if gradient_reduce not in ("reduce_scatter", "all_reduce"):
            raise ValueError(f"DP rank {self.rank}: gradient_reduce must be 'reduce_scatter' or 'all_reduce', "
                             f"got {gradient_reduce!r}")
        self.params = list(params)
        self.numel = sum(p.numel() for p in self.params)
        self.chunk = -(-self.numel // self.dp)
        self.start, self.stop = chunk_bounds(self.numel, self.dp, self.rank)
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        # this rank's master copy of its chunk: the inner optimizer's only parameter
        self.shard = flat[self.start:self.stop].clone().requires_grad_(True)
        make_inner = make_inner or optim.AdamW
        self.inner = make_inner([self.shard])

    # ------------------------------------------------------------------ the torch optimizer API
    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None
        self.shard.grad = None

    def _flat_gradient(self):
        """Every local gradient in one flat tensor, zero-padded to dp chunks (a missing grad is 0)."""
        grads = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), dtype=p.dtype,
                 device=p.device) for p in self.params]
        flat = torch.cat(grads)
        return F.pad(flat, (0, self.chunk * self.dp - self.numel))   # (dp * S,)

    @torch.no_grad()
    def step(self):
        """Average this rank's chunk of the gradients over the DP group, update it, gather every chunk."""
        flat = self._flat_gradient()
        n = self.stop - self.start
        if self.gradient_reduce == "all_reduce":   # naive: the whole average, of which 1/dp is used
            mine = all_reduce(self.group, flat)[self.start:self.stop]
        else:                                       # P_os: chunk r of the sum arrives on rank r only
            mine = reduce_scatter(self.group, flat, dim=0)[:n]
        if self.stage == 2:
            for p in self.params:   # the full gradient is not kept (ZeRO-2's saving)
                p.grad = None
        self.shard.grad = (mine / self.dp).clone()
        self.inner.step()
        # all-gather the updated chunks (padded to S) and write them into the parameters
        piece = F.pad(self.shard.detach(), (0, self.chunk - n))
        full = all_gather(self.group, piece, dim=0)[:self.numel]
        offset = 0
        for p in self.params:
            p.copy_(full[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    # ------------------------------------------------------------------ what it holds
    def state_bytes(self):
        """Bytes of the optimizer state on this rank: AdamW's m and v of its chunk."""
        return optimizer_state_bytes(self.inner)

    def master_bytes(self):
        """Bytes of this rank's flat copy of its chunk of the parameters (what the inner optimizer updates)."""
        return tensor_bytes([self.shard])

    def gradient_bytes(self):
        """Bytes of gradients this optimizer keeps after a step: the chunk's, plus the model's
        full gradients in ZeRO-1 (stage 2 drops them)."""
        return tensor_bytes([self.shard.grad]) + tensor_bytes(p.grad for p in self.params)


def optimizer_state_bytes(optimizer):
    """Bytes of the per-element state of a torch optimizer or a ZeroOptimizer (AdamW: m and v;
    SGD: the momentum). Scalars (AdamW's step count, a 0-d tensor per parameter) are left out."""
    if isinstance(optimizer, ZeroOptimizer):
        return optimizer.state_bytes()
    return sum(tensor_bytes(v for v in state.values() if torch.is_tensor(v) and v.dim() > 0)
               for state in optimizer.state.values())
