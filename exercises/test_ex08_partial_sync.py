"""Graders for Exercise 8: the partial reduce of CAAT-Net and the gradient sum of shared parameters.

Every test runs t simulated ranks (run_spmd) and compares with single-device torch through
the course's one comparison helper. The partial reduce is checked on integer-valued data
(the synced sums are then exact, so bit for bit), with the meter: one all-reduce of exactly
the k synced channels each way. The last test builds a two-block CAAT model on every rank
from your Function and your gradient rule, and compares every gradient with a single-device
model that computes all t streams explicitly.
"""
import math

import pytest
import torch
from torch import nn

from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.partial_sync.mappings import partial_reduce_bytes
from tp_from_scratch.testing import random_array, rank_rng
from tp_from_scratch.tools.grading import collective_calls, run_graded

WORLD_SIZES = [1, 2, 3, 4]
B, T, H = 2, 3, 10
SYNCED = {1.0: 10, 0.5: 5, 0.25: 2, 0.0: 0}  # k = floor(p * H): 2.5 rounds down to 2


def integers(seed, rank, shape):
    return torch.tensor(random_array(rank_rng(seed, rank), shape, integer=True), dtype=torch.float64)


def check_calls(got, expected, what, rank):
    assert got == expected, f"rank {rank}: {what} made the collective calls {got}, expected {expected}"


@pytest.mark.parametrize("p", list(SYNCED))
@pytest.mark.parametrize("t", WORLD_SIZES)
def test_partial_reduce_forward_and_backward(impl, t, p):
    k = SYNCED[p]

    def on_rank(comm):
        x = integers(80, comm.rank, (B, T, H)).requires_grad_()   # this rank's partial sum
        dz = integers(81, comm.rank, (B, T, H))                     # this rank's stream's gradient
        x_before, dz_before = x.detach().clone(), dz.clone()
        comm.meter.reset()
        z = impl.PartialReduceFromTensorParallelRegion.apply(comm, x, p)
        forward = (collective_calls(comm), comm.meter.bytes_sent)
        comm.meter.reset()
        z.backward(dz)
        backward = (collective_calls(comm), comm.meter.bytes_sent)
        aliased = z.data_ptr() == x.data_ptr() or x.grad.data_ptr() == dz.data_ptr()
        return z.detach(), x.grad, forward, backward, x.detach(), x_before, dz, dz_before, aliased

    xs = [integers(80, r, (B, T, H)) for r in range(t)]
    dzs = [integers(81, r, (B, T, H)) for r in range(t)]
    x_sum, dz_sum = sum(xs), sum(dzs)
    calls = {"all_reduce": 1} if k > 0 else {}
    for rank, (z, dx, fwd, bwd, x_after, x_before, dz, dz_before, aliased) in enumerate(run_graded(on_rank, t)):
        nbytes = partial_reduce_bytes((B, T, H), p, t, 8, rank)
        assert_matches_reference(z[..., :k], x_sum[..., :k], name="forward: synced channels (sum over ranks)",
                                 rank=rank, exact=True)
        assert_matches_reference(z[..., k:], xs[rank][..., k:] * math.sqrt(t),
                                 name="forward: private channels (own partial sum times sqrt(t))", rank=rank)
        assert_matches_reference(dx[..., :k], dz_sum[..., :k], name="backward: synced channels", rank=rank,
                                 exact=True)
        assert_matches_reference(dx[..., k:], dzs[rank][..., k:] * math.sqrt(t),
                                 name="backward: private channels", rank=rank)
        if t > 1:  # one rank has nothing to exchange: skipping the call there is fine
            check_calls(fwd[0], calls, "forward", rank)
            check_calls(bwd[0], calls, "backward", rank)
        assert fwd[1] == nbytes, f"rank {rank}: forward sent {fwd[1]} bytes; all-reducing {k} channels sends {nbytes}"
        assert bwd[1] == nbytes, f"rank {rank}: backward sent {bwd[1]} bytes; all-reducing {k} channels sends {nbytes}"
        assert_matches_reference(x_after, x_before, name="input x (must not change)", rank=rank, exact=True)
        assert_matches_reference(dz, dz_before, name="incoming gradient (must not change)", rank=rank, exact=True)
        assert not aliased, f"rank {rank}: an output shares memory with an input"


def test_sync_fraction_outside_0_1_raises(impl):
    def on_rank(comm):
        x = torch.ones(B, T, H, dtype=torch.float64)
        for p in (-0.1, 1.5):
            with pytest.raises(ValueError):
                impl.PartialReduceFromTensorParallelRegion.apply(comm, x, p)

    run_graded(on_rank, 2)


def test_large_values_stay_finite(impl):
    # activations near 1e300 / sqrt(t): the private scaling must not overflow, the sums stay exact
    t, p = 3, 0.5

    def on_rank(comm):
        x = integers(82, comm.rank, (B, T, H)) * 1e299
        return impl.PartialReduceFromTensorParallelRegion.apply(comm, x, p)

    xs = [integers(82, r, (B, T, H)) * 1e299 for r in range(t)]
    for rank, z in enumerate(run_graded(on_rank, t)):
        assert torch.isfinite(z).all(), f"rank {rank}: non-finite output"
        assert_matches_reference(z[..., 5:], xs[rank][..., 5:] * math.sqrt(t), name="private channels", rank=rank)
        assert_matches_reference(z[..., :5], sum(xs)[..., :5], name="synced channels", rank=rank)


REPLICATED = ["blocks.0.ln1.weight", "blocks.0.ln1.bias", "blocks.3.ln2.weight", "blocks.3.ln2.bias",
              "ln_f.weight", "ln_f.bias", "blocks.0.attn.o.bias", "blocks.1.mlp.proj.bias"]
NOT_REPLICATED = ["wte.weight", "wpe.weight", "lm_head.weight", "blocks.0.attn.q.weight", "blocks.0.attn.q.bias",
                  "blocks.0.attn.k.weight", "blocks.0.attn.v.bias", "blocks.0.attn.o.weight",
                  "blocks.2.mlp.fc.weight", "blocks.2.mlp.fc.bias", "blocks.2.mlp.proj.weight"]


def test_is_replicated_parameter(impl):
    wrong = [n for n in REPLICATED if not impl.is_replicated_parameter(n)]
    wrong += [n for n in NOT_REPLICATED if impl.is_replicated_parameter(n)]
    assert not wrong, f"is_replicated_parameter is wrong for {wrong}"


def _named_model(names):
    """A module whose parameters carry exactly these dotted names (2 x 3 each)."""
    root = nn.Module()
    for name in names:
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, nn.Module())
            module = getattr(module, part)
        module.register_parameter(leaf, nn.Parameter(torch.zeros(2, 3, dtype=torch.float64)))
    return root


@pytest.mark.parametrize("t", WORLD_SIZES)
def test_all_reduce_replicated_grads_sums_exactly_those(impl, t):
    names = REPLICATED + NOT_REPLICATED

    def on_rank(comm):
        model = _named_model(names)
        for name, p in model.named_parameters():
            if name != "blocks.0.ln1.bias":  # this one has no gradient: it must stay None
                p.grad = integers(83 + names.index(name), comm.rank, (2, 3))
        comm.meter.reset()
        impl.all_reduce_replicated_grads(comm, model)
        return {n: p.grad for n, p in model.named_parameters()}, collective_calls(comm)

    for rank, (grads, calls) in enumerate(run_graded(on_rank, t)):
        for i, name in enumerate(names):
            if name == "blocks.0.ln1.bias":
                assert grads[name] is None, f"rank {rank}: {name} had no gradient and must keep none"
                continue
            own = integers(83 + i, rank, (2, 3))
            expected = sum(integers(83 + i, r, (2, 3)) for r in range(t)) if name in REPLICATED else own
            assert_matches_reference(grads[name], expected, name=f"grad of {name}", rank=rank, exact=True)
        if t > 1:
            check_calls(calls, {"all_reduce": 1}, "all_reduce_replicated_grads", rank)


# -- a two-block CAAT model on every rank against the t-stream single-device model -----------

F_PER_RANK = 4


class _Block(nn.Module):
    """ln1 -> fc (column: this rank's F/t) -> gelu -> proj (row) -> partial reduce -> + bias, residual."""

    def __init__(self, f_local):
        super().__init__()
        self.ln1 = nn.LayerNorm(H, dtype=torch.float64)
        self.mlp = nn.Module()
        self.mlp.fc = nn.Linear(H, f_local, dtype=torch.float64)
        self.mlp.proj = nn.Linear(f_local, H, dtype=torch.float64)

    def partial(self, x):
        return nn.functional.linear(torch.tanh(self.mlp.fc(self.ln1(x))), self.mlp.proj.weight)


def _model(f_local):
    model = nn.Module()
    model.blocks = nn.ModuleList(_Block(f_local) for _ in range(2))
    model.ln_f = nn.LayerNorm(H, dtype=torch.float64)
    return model


def _full_model(t, seed=84):
    model = _model(F_PER_RANK * t)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for q in model.parameters():
            q.add_(torch.randn(q.shape, generator=gen, dtype=q.dtype) * 0.3)
    return model


def _shard(full_state, rank):
    """Rank ``rank``'s model: rows of fc, columns of proj, everything else whole (copies)."""
    model = _model(F_PER_RANK)
    rows = slice(rank * F_PER_RANK, (rank + 1) * F_PER_RANK)
    with torch.no_grad():
        for name, q in model.named_parameters():
            source = full_state[name]
            if name.endswith(("fc.weight", "fc.bias")):
                source = source[rows]
            elif name.endswith("proj.weight"):
                source = source[:, rows]
            q.copy_(source)
    return model


def _stream_reduce(parts, p):
    k = int(p * H)
    return [torch.cat([sum(q[..., :k] for q in parts), parts[s][..., k:] * math.sqrt(len(parts))], dim=-1)
            for s in range(len(parts))]


@pytest.mark.parametrize("t", WORLD_SIZES)
def test_caat_model_gradients_match_the_t_stream_model(impl, t):
    p = 0.5
    x = integers(85, 0, (B, T, H))
    heads = [integers(86, r, (B, T, H)) for r in range(t)]  # each stream's own readout

    # single device: t streams explicitly, each with its rank's shard of fc and proj
    full = _full_model(t)
    full_state = {n: q.detach().clone() for n, q in full.named_parameters()}
    streams = [x] * t
    for i in range(2):
        fc_w, fc_b = full.blocks[i].mlp.fc.weight, full.blocks[i].mlp.fc.bias
        proj_w = full.blocks[i].mlp.proj.weight
        parts = []
        for r, x_s in enumerate(streams):
            rows = slice(r * F_PER_RANK, (r + 1) * F_PER_RANK)
            a = torch.tanh(nn.functional.linear(full.blocks[i].ln1(x_s), fc_w[rows], fc_b[rows]))
            parts.append(nn.functional.linear(a, proj_w[:, rows]))
        reduced = _stream_reduce(parts, p)
        streams = [x_s + z + full.blocks[i].mlp.proj.bias for x_s, z in zip(streams, reduced)]
    loss = sum((full.ln_f(s) * h).sum() for s, h in zip(streams, heads))
    loss.backward()
    expected = {n: q.grad for n, q in full.named_parameters()}

    def on_rank(comm):
        model = _shard(full_state, comm.rank)
        y = x
        for block in model.blocks:
            z = impl.PartialReduceFromTensorParallelRegion.apply(comm, block.partial(y), p)
            y = y + z + block.mlp.proj.bias
        (model.ln_f(y) * heads[comm.rank]).sum().backward()
        impl.all_reduce_replicated_grads(comm, model)
        return {n: q.grad for n, q in model.named_parameters()}

    rows = lambda r: slice(r * F_PER_RANK, (r + 1) * F_PER_RANK)  # noqa: E731
    for rank, grads in enumerate(run_graded(on_rank, t)):
        for name, g in grads.items():
            want = expected[name]
            if name.endswith(("fc.weight", "fc.bias")):
                want = want[rows(rank)]
            elif name.endswith("proj.weight"):
                want = want[:, rows(rank)]
            assert_matches_reference(g, want, name=f"grad of {name}", rank=rank)
