"""Measuring what a rank holds: weights, gradients, optimizer state and saved activations.

Weights, gradients and optimizer state are tensors we can list and add up. Activations are
what autograd keeps for backward: ``torch.autograd.graph.saved_tensors_hooks`` sees every
tensor the moment it is saved. ``SavedActivations`` wraps each in a small holder whose
bytes count while autograd keeps the holder alive (it drops it once backward has used it),
so it measures the bytes saved at the peak, not just the total ever saved. Parameters that
autograd saves (a linear layer saves its weight) are weights, not activations: left out.
Tensors that share storage are counted once per save (a view saved twice counts twice);
this is an upper bound on what the allocator holds, the same for every strategy.
"""
import contextlib

import torch

from tp_from_scratch.parallelisms.zero import ZeroOptimizer, optimizer_state_bytes, tensor_bytes


class _Held:
    """One saved tensor; its bytes count until autograd lets go of it."""
    __slots__ = ("tensor", "owner", "nbytes")

    def __init__(self, tensor, owner, nbytes):
        self.tensor, self.owner, self.nbytes = tensor, owner, nbytes
        owner.live += nbytes
        owner.peak = max(owner.peak, owner.live)

    def __del__(self):
        self.owner.live -= self.nbytes


class SavedActivations:
    """Live and peak bytes of the tensors autograd saves for backward inside ``tracking()``.

    params: the model's parameters (excluded: they are weights). ``reset_peak()`` between steps.
    """

    def __init__(self, params=()):
        self.weights = {p.untyped_storage().data_ptr() for p in params}
        self.live = 0
        self.peak = 0

    def reset_peak(self):
        self.peak = self.live

    def _pack(self, t):
        is_weight = t.untyped_storage().data_ptr() in self.weights
        return _Held(t, self, 0 if is_weight else t.numel() * t.element_size())

    @staticmethod
    def _unpack(held):
        return held.tensor

    @contextlib.contextmanager
    def tracking(self):
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield self


def memory_snapshot(model, optimizer, activations_peak=0):
    """{"weights", "gradients", "optimizer", "activations"} in bytes on this rank, now.

    Call it after backward and before zero_grad: the gradients are what the step leaves
    allocated (the model's .grad tensors, and a ZeroOptimizer's chunk gradient).
    """
    params = list(model.parameters())
    grads = tensor_bytes(p.grad for p in params)
    if isinstance(optimizer, ZeroOptimizer):
        grads = optimizer.gradient_bytes()
        weights = tensor_bytes(params) + optimizer.master_bytes()
    else:
        weights = tensor_bytes(params)
    return {"weights": weights, "gradients": grads, "optimizer": optimizer_state_bytes(optimizer),
            "activations": activations_peak}
