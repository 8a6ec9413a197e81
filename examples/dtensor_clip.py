"""Gradient clipping on a model given to DTensor's parallelize_module (docs/verify.md, section 9).

A plan usually leaves some modules alone (the norms; an embedding it does not split): their
parameters stay plain tensors beside the plan's DTensors, and torch.nn.utils.clip_grad_norm_
on such a model raises in PyTorch 2.13 ("aten._foreach_norm.Scalar got mixed torch.Tensor and
DTensor"; with foreach=False, "aten.mul_.Tensor got mixed ..."). Two ways that work, each
checked against the single-device clip by tests/verify_model_planted_dtensor.py:clip_grad_norm_paths:

    replicate_the_rest(model, mesh)   every module the plan left alone distributed Replicate
                                      (its inputs brought in as Replicate DTensors, its output
                                      handed back local), so every parameter is a DTensor: then
                                      clip_grad_norm_ works as it is, foreach or not
    clip_grad_norm(parameters, max_norm)   the clip written out for a mixed model: each
                                      parameter's norm over its whole tensor (a DTensor's norm,
                                      made full), their norm, every gradient scaled in place

(A plain tensor is taken to be replicated. A library that shards plain tensors, as this
course's layers do, must sum its shards' squares over the TP group instead.)
"""
import torch
from torch.distributed.tensor import DTensor, Replicate, distribute_module


def replicate_the_rest(model, mesh):
    """Distribute, Replicate, every module of ``model`` holding parameters none of which is a DTensor."""
    planned = {id(p) for p in model.parameters() if isinstance(p, DTensor)}
    for module in list(model.modules()):
        own = list(module.parameters(recurse=False))
        if own and not any(id(p) in planned for p in own):
            distribute_module(module, mesh, input_fn=_inputs_replicated, output_fn=_output_local)
    return model


def _inputs_replicated(module, inputs, mesh):
    return tuple(x if isinstance(x, DTensor) or not isinstance(x, torch.Tensor)
                 else DTensor.from_local(x, mesh, [Replicate()]) for x in inputs)


def _output_local(module, output, mesh):
    return output.to_local() if isinstance(output, DTensor) else output


def clip_grad_norm(parameters, max_norm, eps=1e-6):
    """torch.nn.utils.clip_grad_norm_ (the 2-norm) for parameters mixing plain (replicated)
    tensors and DTensors; returns the total norm, a plain tensor, the same on every rank."""
    grads = [p.grad for p in parameters if p.grad is not None]
    with torch.no_grad():
        norms = [torch.linalg.vector_norm(g) for g in grads]
        total = torch.linalg.vector_norm(torch.stack(
            [n.full_tensor() if isinstance(n, DTensor) else n for n in norms]))
        scale = (max_norm / (total + eps)).clamp(max=1.0)
        for g in grads:
            (g.to_local() if isinstance(g, DTensor) else g).mul_(scale)
    return total
