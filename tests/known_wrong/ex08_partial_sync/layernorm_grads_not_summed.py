"""Known-wrong: only the row-parallel biases get their gradients summed; the LayerNorms' stay per rank."""
import torch

from tp_from_scratch.nn.mappings import all_reduce
from tp_from_scratch.partial_sync.autograd import PartialReduceFromTensorParallelRegion  # noqa: F401


def is_replicated_parameter(name):
    return name.endswith(("attn.o.bias", "mlp.proj.bias"))


def all_reduce_replicated_grads(group, model):
    params = [p for n, p in model.named_parameters() if is_replicated_parameter(n) and p.grad is not None]
    if not params:
        return
    summed = all_reduce(group, torch.cat([p.grad.reshape(-1) for p in params]))
    for p, piece in zip(params, torch.split(summed, [p.numel() for p in params])):
        p.grad = piece.view_as(p).clone()
