"""AdamW and SGD with momentum, written out: the optimizers the course's trainers run.

Both are element-wise: each number of a parameter is updated from that number's gradient and
state alone. That is why an optimizer needs no message under TP: a rank holding a slice of W
(rows of a column-parallel layer, columns of a row-parallel one) updates it exactly as one
device updates that slice of the whole W (Lesson 6), and a replicated parameter, whose gradient
every rank holds whole, stays identical on every rank.

    AdamW(params, lr, betas, eps, weight_decay)    Loshchilov and Hutter's decoupled weight decay
    SGD(params, lr, momentum, weight_decay)        heavy-ball momentum, as torch.optim.SGD

They are torch.optim's single-tensor path (``foreach=False``, which is also what torch picks for
tensors on the CPU, DTensors included; on CUDA it picks foreach) written out, operation for
operation, so the results are the same bits: tests/test_optim.py holds them to
``torch.optim.AdamW`` and ``torch.optim.SGD`` at float32 and float64, with and without weight
decay, on plain tensors and on DTensors. The state has torch's keys ("step", "exp_avg",
"exp_avg_sq"; "momentum_buffer"), so a checkpoint's optimizer state is the same either way.
What is left out: parameter groups beyond one (a list of dicts is refused), complex parameters
(refused), amsgrad, maximize, dampening, nesterov, ``step(closure)``, tensor learning rates,
foreach and fused kernels, ``state_dict()`` (the course keeps the state by parameter name,
gpt/checkpoint.py).

Why not torch.optim itself: constructing any torch.optim optimizer imports ``torch._dynamo``
(``Optimizer.add_param_group`` is wrapped by ``torch._disable_dynamo``, which imports it on its
first call, torch/_compile.py; ``step`` by ``_use_grad_for_differentiable``, which imports it
too: torch 2.13's torch/optim/optimizer.py), about 2.7 s of CPU in every process that trains
(some two dozen of `make test`'s processes on 2 cores). Lesson 5's layer checks, the notebook
cells that build a torch.optim optimizer, the DTensor plans, ``verify model`` and the benchmarks
(and the calibration that models them) keep torch.optim: the optimizer an engineer uses.

    AdamW step k (k = 1, 2, ...), for each element:
        p <- p * (1 - lr * wd)
        m <- m + (1 - b1) (g - m)                  torch's lerp
        v <- b2 v + (1 - b2) g^2
        p <- p - lr / (1 - b1^k) * m / (sqrt(v) / sqrt(1 - b2^k) + eps)
"""
import torch


class _ElementWise:
    """One parameter group; ``state`` maps a parameter to its dict of tensors, as torch.optim's."""

    def __init__(self, params, **defaults):
        if torch.is_tensor(params):
            raise TypeError("params must be an iterable of tensors, not a tensor (e.g. model.parameters())")
        params = list(params)
        if not params:
            raise ValueError("the optimizer got an empty parameter list")
        if any(not torch.is_tensor(p) for p in params):
            raise TypeError("params must be tensors (one group: parameter-group dicts are not supported)")
        if any(p.is_complex() for p in params):
            raise TypeError("complex parameters are not supported (torch.optim's view_as_real path is left out)")
        if not 0.0 <= defaults["lr"]:
            raise ValueError(f"learning rate lr must be >= 0, got {defaults['lr']}")
        if not 0.0 <= defaults["weight_decay"]:
            raise ValueError(f"weight_decay must be >= 0, got {defaults['weight_decay']}")
        self.param_groups = [{"params": params, **defaults}]
        self.state = {}

    def zero_grad(self, set_to_none=True):
        """Every parameter's gradient to None (or to zeros, set_to_none=False)."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:                               # as torch's: a view cannot be detached in place
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    @torch.no_grad()
    def step(self):
        """One update of every parameter that has a gradient (the others are left as they are)."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, p.grad, group)


class AdamW(_ElementWise):
    """torch.optim.AdamW(params, lr, betas, eps, weight_decay, foreach=False), written out; the
    defaults are torch's."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        for name, value in (("betas[0]", betas[0]), ("betas[1]", betas[1])):
            if not 0.0 <= value < 1.0:
                raise ValueError(f"AdamW's {name} must be in [0, 1), got {value}")
        if not 0.0 <= eps:
            raise ValueError(f"AdamW's eps must be >= 0, got {eps}")
        super().__init__(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)

    def _update(self, p, grad, group):
        state = self.state.setdefault(p, {})
        if not state:
            # torch keeps the step count as a CPU tensor, float64 when that is the default dtype
            scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
            state["step"] = torch.tensor(0.0, dtype=scalar, device="cpu")
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        lr, (beta1, beta2), eps, weight_decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        state["step"] += 1
        if weight_decay != 0:
            p.mul_(1 - lr * weight_decay)          # decoupled: the decay never enters m or v
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = state["step"].item()
        bias_correction1 = 1 - beta1 ** step
        bias_correction2 = 1 - beta2 ** step
        denom = (exp_avg_sq.sqrt() / bias_correction2 ** 0.5).add_(eps)
        p.addcdiv_(exp_avg, denom, value=-(lr / bias_correction1))


class SGD(_ElementWise):
    """torch.optim.SGD(params, lr, momentum, weight_decay, foreach=False), written out (no
    dampening, no Nesterov); the defaults are torch's."""

    def __init__(self, params, lr=1e-3, momentum=0.0, weight_decay=0.0):
        if not 0.0 <= momentum:
            raise ValueError(f"SGD's momentum must be >= 0, got {momentum}")
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay)

    def _update(self, p, grad, group):
        if group["weight_decay"] != 0:
            grad = grad.add(p, alpha=group["weight_decay"])
        if group["momentum"] != 0:
            state = self.state.setdefault(p, {})   # none without momentum, as torch's
            buf = state.get("momentum_buffer")
            if buf is None:                         # the first step: the gradient itself
                buf = state["momentum_buffer"] = grad.detach().clone()
            else:
                buf.mul_(group["momentum"]).add_(grad)
            grad = buf
        p.add_(grad, alpha=-group["lr"])
