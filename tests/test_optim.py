"""gpt/optim.py's AdamW and SGD are torch.optim's, bit for bit.

run_both runs the same steps on two copies of the same parameters, one under torch.optim (the
independent implementation, its single-tensor path) and one under ours, with the same random
gradients each step (the AdamW and SGD tests leave one parameter without a gradient in some
steps; the learning rate is changed through param_groups midway), and demands the same bits
(signs of zeros included) in the parameters, their gradients and the state after every step.
"""
import pytest
import torch

from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.gpt import optim
from tp_from_scratch.testing import random_array, rank_rng

STEPS = 6
SHAPES = [(5, 3), (7,), (2, 3, 4), (0, 3)]   # an empty parameter too


def parameters(dtype, seed=0):
    # the first tiny: its updates are larger than it, so a last-bit difference in an update shows
    rng = rank_rng(seed)
    return [torch.nn.Parameter(torch.from_numpy(random_array(rng, s) * (1e-6 if i == 0 else 1.0)).to(dtype))
            for i, s in enumerate(SHAPES)]


def gradient(step, index, shape, dtype):
    # a few exact zeros and large values, as real gradients have
    g = torch.from_numpy(random_array(rank_rng(1000 + step, index), shape)).to(dtype)
    return torch.where(g.abs() < 0.1, torch.zeros_like(g), g) * (1e3 if index == 2 else 1.0)


def assert_same_bits(got, want, name):
    """assert_matches_reference(exact=True), and the bit patterns too (it takes -0.0 for 0.0)."""
    assert_matches_reference(got, want, name=name, exact=True)
    if got.is_floating_point() and got.numel():
        ints = {torch.float32: torch.int32, torch.float64: torch.int64}[got.dtype]
        assert torch.equal(got.detach().view(ints), want.detach().view(ints)), f"{name}: the signs of zeros differ"


def run_both(make_torch, make_ours, dtype, skip=lambda step, index: False):
    """Train two copies step by step; compare parameters and state bitwise after each step."""
    mine, theirs = parameters(dtype), parameters(dtype)
    opt_theirs, opt_mine = make_torch(theirs), make_ours(mine)
    for step in range(STEPS):
        opt_theirs.zero_grad(set_to_none=True)
        opt_mine.zero_grad(set_to_none=True)
        if step == STEPS // 2:
            for opt in (opt_theirs, opt_mine):
                opt.param_groups[0]["lr"] *= 0.5
        for index, (a, b) in enumerate(zip(theirs, mine)):
            if not skip(step, index):
                a.grad = gradient(step, index, a.shape, dtype)
                b.grad = gradient(step, index, b.shape, dtype)
        opt_theirs.step()
        opt_mine.step()
        for index, (a, b) in enumerate(zip(theirs, mine)):
            where = f"parameter {index} after step {step}"
            assert_same_bits(b.detach(), a.detach(), where)
            assert (b.grad is None) == (a.grad is None), f"{where}: gradient kept or not"
            if a.grad is not None:   # the step leaves the gradient as it was
                assert_same_bits(b.grad, a.grad, f"gradient of {where}")
            assert (b in opt_mine.state) == (a in opt_theirs.state), f"{where}: state kept or not"
            if a in opt_theirs.state:
                assert set(opt_mine.state[b]) == set(opt_theirs.state[a]), where
                for key, value in opt_theirs.state[a].items():
                    assert_same_bits(opt_mine.state[b][key], value, f"{key} of {where}")
                    assert opt_mine.state[b][key].device == value.device, f"{key} of {where}: device"
    return mine


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_is_torch_adamw_bit_for_bit(dtype, weight_decay):
    kwargs = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay)
    mine = run_both(lambda ps: torch.optim.AdamW(ps, foreach=False, **kwargs),
                    lambda ps: optim.AdamW(ps, **kwargs), dtype,
                    skip=lambda step, index: index == 1 and step in (0, 3))
    assert not torch.equal(mine[0], parameters(dtype)[0]), "the steps moved nothing: the test proves nothing"


def test_adamw_defaults_are_torchs():
    run_both(lambda ps: torch.optim.AdamW(ps, foreach=False), optim.AdamW, torch.float32)


def test_adamw_under_a_float64_default_dtype_counts_steps_in_float64_as_torch():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        run_both(lambda ps: torch.optim.AdamW(ps, foreach=False), optim.AdamW, torch.float64)
        assert optim.AdamW(parameters(torch.float64)) is not None
    finally:
        torch.set_default_dtype(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kwargs", [dict(lr=0.1, momentum=0.9), dict(lr=0.05), dict(lr=0.1, momentum=0.5, weight_decay=0.01)],
                         ids=["momentum", "plain", "weight-decay"])
def test_sgd_is_torch_sgd_bit_for_bit(dtype, kwargs):
    run_both(lambda ps: torch.optim.SGD(ps, foreach=False, **kwargs), lambda ps: optim.SGD(ps, **kwargs), dtype,
             skip=lambda step, index: index == 0 and step == 1)


def test_zero_grad_is_torchs_also_without_set_to_none():
    """Zeroed in place, the same tensor kept; a gradient that is a view, or one with a grad_fn,
    handled as torch handles it (a view cannot be detached in place)."""
    def with_gradients(ps):
        base = torch.ones(100, dtype=torch.float64)
        leaf = torch.ones(3, requires_grad=True, dtype=torch.float64)
        ps[0].grad = base[:15].view(5, 3)                     # a view
        ps[1].grad = (leaf * 2).sum() * torch.ones(7, dtype=torch.float64)   # has a grad_fn
        ps[2].grad = torch.full((2, 3, 4), 3.0, dtype=torch.float64)
        return [p.grad for p in ps[:3]]

    for set_to_none in (False, True):
        results = []
        for make in (lambda ps: torch.optim.AdamW(ps, foreach=False), optim.AdamW):
            ps = parameters(torch.float64)
            grads = with_gradients(ps)
            make(ps).zero_grad(set_to_none=set_to_none)
            results.append([(p.grad is None, p.grad is g, None if p.grad is None else
                             (p.grad.tolist(), p.grad.requires_grad, p.grad.grad_fn is None))
                            for p, g in zip(ps, grads)])
        assert results[0] == results[1], f"set_to_none={set_to_none}: torch {results[0]}, ours {results[1]}"


@pytest.mark.parametrize("make, error", [
    (lambda: optim.AdamW([]), "empty parameter list"),
    (lambda: optim.AdamW(torch.zeros(2)), "not a tensor"),
    (lambda: optim.AdamW(parameters(torch.float32), lr=-1.0), "lr must be >= 0"),
    (lambda: optim.AdamW(parameters(torch.float32), betas=(0.9, 1.0)), "betas[1] must be in [0, 1)"),
    (lambda: optim.AdamW(parameters(torch.float32), eps=-1e-8), "eps must be >= 0"),
    (lambda: optim.SGD(parameters(torch.float32), lr=0.1, momentum=-0.1), "momentum must be >= 0"),
    (lambda: optim.AdamW(parameters(torch.float32), weight_decay=-0.1), "weight_decay must be >= 0"),
    (lambda: optim.AdamW([{"params": parameters(torch.float32)}]), "parameter-group dicts are not supported"),
    (lambda: optim.SGD([torch.zeros(2, dtype=torch.complex64)]), "complex parameters are not supported"),
])
def test_bad_arguments_are_refused_naming_the_quantity(make, error):
    with pytest.raises((ValueError, TypeError)) as info:
        make()
    assert error in str(info.value)


def test_adamw_and_sgd_on_dtensor_parameters_are_torchs_bit_for_bit(monkeypatch):
    """The trainer's --impl dtensor hands DTensor parameters to the same optimizer."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from tp_from_scratch.comm.launchers import free_port
    # monkeypatch: MASTER_ADDR left behind would make later tests of this worker look launched by torchrun
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))

        def as_dtensors(ps):
            return [torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)])) for p in ps]

        def with_dtensor_grads(make):
            def build(ps):
                opt = make(as_dtensors(ps))
                return _DTensorBridge(ps, opt)
            return build

        # a world of one: DTensor's dispatch runs every operation, on a shard that is the whole
        # tensor (the trainers' --impl dtensor runs split over ranks, checked end to end)
        kwargs = dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
        skip = lambda step, index: index == 1 and step == 2   # noqa: E731
        run_both(with_dtensor_grads(lambda ps: torch.optim.AdamW(ps, foreach=False, **kwargs)),
                 with_dtensor_grads(lambda ps: optim.AdamW(ps, **kwargs)), torch.float64, skip)
        kwargs = dict(lr=0.1, momentum=0.9, weight_decay=0.01)
        run_both(with_dtensor_grads(lambda ps: torch.optim.SGD(ps, foreach=False, **kwargs)),
                 with_dtensor_grads(lambda ps: optim.SGD(ps, **kwargs)), torch.float32, skip)
    finally:
        dist.destroy_process_group()


class _DTensorBridge:
    """Runs an optimizer on DTensor copies of plain parameters: each step hands the plain
    gradients over as DTensors and copies the updated values back, so run_both can compare."""

    def __init__(self, plain, opt):
        self.plain, self.opt, self.param_groups = plain, opt, opt.param_groups
        self.dtensors = opt.param_groups[0]["params"]

    def zero_grad(self, set_to_none=True):
        self.opt.zero_grad(set_to_none)
        for p in self.plain:   # a parameter left without a gradient this step stays without
            p.grad = None

    def step(self):
        from torch.distributed.tensor import distribute_tensor
        for p, d in zip(self.plain, self.dtensors):
            d.grad = None if p.grad is None else distribute_tensor(p.grad, d.device_mesh, d.placements)
        self.opt.step()
        with torch.no_grad():
            for p, d in zip(self.plain, self.dtensors):
                assert type(d.data).__name__ == "DTensor"
                p.copy_(d.full_tensor())

    @property
    def state(self):
        return {p: {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in self.opt.state[d].items()}
                for p, d in zip(self.plain, self.dtensors) if d in self.opt.state}
