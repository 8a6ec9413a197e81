"""The tolerance policy's growth rule (tp_from_scratch/compare.py): depth, steps, AdamW's lr / eps.

Story: the bound grows as the docstring says; AdamW's first step really does turn a gradient
error delta on an entry near 0 into a weight error near lr * delta / eps (and never more), while
on a large entry it is lost in the update's own roundoff; finite differences get h^2 + eps_machine / h.
"""
import numpy as np
import pytest
import torch

from tp_from_scratch.compare import TOLERANCE, finite_difference_tolerance, tolerance


def test_the_bound_grows_with_depth_and_steps_and_adamws_amplification():
    assert tolerance("float64") == TOLERANCE["float64"]
    assert tolerance(torch.float32, layers=2, steps=3) == pytest.approx(TOLERANCE["float32"] * 2 * 4)
    assert tolerance(np.float64, layers=2, steps=3, adamw_lr=1e-2) == pytest.approx(1e-12 * 2 * 4 * 1e6)
    assert tolerance("bfloat16", layers=0) == TOLERANCE["bfloat16"]       # at least one layer
    assert finite_difference_tolerance(1e-6) == pytest.approx(1000 * (1e-12 + np.finfo(np.float64).eps / 1e-6))


def first_adamw_step(gradient, lr, eps=1e-8):
    w = torch.zeros_like(gradient, requires_grad=True)
    optimizer = torch.optim.AdamW([w], lr=lr, eps=eps, weight_decay=0.0)
    w.grad = gradient.clone()
    optimizer.step()
    return w.detach()


def test_adamw_amplifies_the_roundoff_of_a_near_zero_gradient_by_up_to_lr_over_eps():
    lr, eps, delta = 1e-2, 1e-8, 1e-18   # delta: a float64 roundoff on a gradient of size ~0.01
    gradient = torch.tensor([0.0, 1e-9, 1e-3], dtype=torch.float64)
    moved = (first_adamw_step(gradient + delta, lr) - first_adamw_step(gradient, lr)).abs()
    # at g = 0 the weight moves by lr * delta / eps: 1e6 times the gradient's error
    assert moved[0].item() == pytest.approx(lr * delta / eps, rel=1e-6)
    assert moved[1].item() > 1e5 * delta                                  # still amplified at g = 1e-9
    # a large entry: lr * eps / g^2 = 1e-4 times delta, below one roundoff of the update itself
    assert moved[2].item() <= np.spacing(lr)
    assert (moved <= lr * delta / eps * (1 + 1e-9)).all()                 # never more than lr / eps
