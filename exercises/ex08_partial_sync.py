"""Exercise 8: CAAT-Net's partial reduce as a torch autograd Function, and the gradient rule
for the parameters every rank applies to its own stream (lessons/08_partial_sync.ipynb).

Replace each `raise NotImplementedError(...)` with your code, then run
    make grade            (or: .venv/bin/python -m pytest exercises -m ex08 -x)

Everything runs on ONE rank. `group` is that rank's communicator (the graders pass the
simulated ranks' Comm; a real run passes a torch ProcessGroup). The library gives you:

    all_reduce(group, x)          -> a new tensor, the sum of x over the ranks
    tp_world_size(group)          -> t
    synced_channels(H, p)         -> k = floor(p * H), the number of leading channels to sync

The partial reduce replaces g at the row-parallel outputs: x (..., H) holds this rank's
partial sum. Forward: the first k channels are all-reduced; the other H - k stay this
rank's own ("private"), multiplied by sqrt(t). Backward: derive it (the lesson does). Use
one all-reduce each way when k > 0 and none when k = 0; send only the k channels (the
graders read the meter's bytes); never modify the input or the incoming gradient.
"""
import torch  # noqa: F401

from tp_from_scratch.nn.mappings import all_reduce, tp_world_size  # noqa: F401
from tp_from_scratch.partial_sync.mappings import synced_channels  # noqa: F401


class PartialReduceFromTensorParallelRegion(torch.autograd.Function):
    """forward(ctx, group, x, p): all-reduce x[..., :k], sqrt(t) * x[..., k:]; backward: yours."""

    @staticmethod
    def forward(ctx, group, x, p):
        raise NotImplementedError("Exercise 8 (PartialReduceFromTensorParallelRegion): see lessons/08_partial_sync.ipynb")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("Exercise 8 (PartialReduceFromTensorParallelRegion): see lessons/08_partial_sync.ipynb")


def is_replicated_parameter(name):
    """True when the parameter called ``name`` needs its gradient summed over the TP ranks.

    Names are those of tp_from_scratch.gpt.model's GPT, e.g. "blocks.0.ln1.weight",
    "blocks.1.attn.o.bias", "blocks.0.mlp.fc.weight", "ln_f.bias", "wpe.weight". Which
    parameters does every rank hold whole but apply to its own, different stream?
    """
    raise NotImplementedError("Exercise 8 (is_replicated_parameter): see lessons/08_partial_sync.ipynb")


def all_reduce_replicated_grads(group, model):
    """After backward: replace the .grad of every replicated parameter of ``model`` by its sum
    over the ranks, with ONE all-reduce for all of them; skip parameters whose .grad is None."""
    raise NotImplementedError("Exercise 8 (all_reduce_replicated_grads): see lessons/08_partial_sync.ipynb")
