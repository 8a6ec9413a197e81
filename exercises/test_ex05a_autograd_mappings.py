"""Graders for Exercise 5a: the autograd region mappings and the parallel linear layers in torch.

Every test runs t simulated ranks (run_spmd: threads in one process, the from-scratch
collectives underneath) and compares each rank's output and every gradient with single-device
torch (the identity, a sum, torch.nn.Linear) through the course's one comparison helper.
Each test also reads the rank's meter: which collectives run, forward and backward, is part
of the specification (f all-reduces in backward only, g in forward only; at t = 1 skipping
the collective passes too, as in Megatron-LM). Inputs and the incoming gradients must be
unchanged afterwards, and scatter's chunk is a new tensor, not a view of its input. A layer built with from_linear must own its parameters: after an
optimizer step on the parallel layer, the single-device nn.Linear it came from is unchanged.
"""
import pytest
import torch

from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.tools.grading import assert_not_aliased, collective_calls, expected_calls, run_graded
from tp_from_scratch.testing import random_array, rank_rng

WORLD_SIZES = [1, 2, 3, 4]
B, T, H, F = 2, 3, 12, 24  # every size divisible by every t above


def calls(comm):
    return collective_calls(comm, reset=True)


def tensor(array, dtype=torch.float64, grad=False):
    return torch.tensor(array, dtype=dtype, requires_grad=grad)


def integers(seed, rank, shape):
    """Rank-distinct integer-valued data: sums are exact in any order, so compare bit for bit."""
    return tensor(random_array(rank_rng(seed, rank), shape, integer=True))


def check_calls(got, expected, what, rank, t):
    assert got in expected_calls(t, expected), (
        f"rank {rank}: {what} made the collective calls {got}, expected {expected}")


def backward_with(y, grad):
    """y.backward(grad), then the proof that backward left the caller's gradient alone."""
    before = grad.clone()
    y.backward(grad)
    assert torch.equal(grad, before), "the incoming gradient was modified in place by backward"


# -- the four mappings ---------------------------------------------------------------------

@pytest.mark.parametrize("t", WORLD_SIZES)
def test_f_copy_to_region_is_identity_forward_and_all_reduce_backward(impl, t):
    def on_rank(comm):
        x = integers(50, 0, (B, T, H)).requires_grad_()  # replicated: rank 0's data everywhere
        comm.meter.reset()
        y = impl.CopyToTensorParallelRegion.apply(comm, x)
        forward = calls(comm)
        backward_with(y, integers(51, comm.rank, (B, T, H)))  # every rank's own gradient contribution
        assert torch.equal(x.detach(), integers(50, 0, (B, T, H))), "f modified its input"
        return y.detach().clone(), x.grad, forward, calls(comm)

    total = sum(integers(51, r, (B, T, H)) for r in range(t))
    for rank, (y, dx, forward, backward) in enumerate(run_graded(on_rank, t)):
        assert_matches_reference(y, integers(50, 0, (B, T, H)), name="f forward (identity)", rank=rank, exact=True)
        assert_matches_reference(dx, total, name="f backward (sum over ranks)", rank=rank, exact=True)
        check_calls(forward, {}, "f forward", rank, t)
        check_calls(backward, {"all_reduce": 1}, "f backward", rank, t)


@pytest.mark.parametrize("t", WORLD_SIZES)
def test_g_reduce_from_region_is_all_reduce_forward_and_identity_backward(impl, t):
    def on_rank(comm):
        x = integers(52, comm.rank, (B, T, H)).requires_grad_()  # a partial sum per rank
        comm.meter.reset()
        y = impl.ReduceFromTensorParallelRegion.apply(comm, x)
        forward = calls(comm)
        # the all-reduce's result is a new tensor, at t = 1 too (where it may skip the call)
        assert_not_aliased(y, [x], "g's forward output", comm.rank)
        backward_with(y, integers(53, 0, (B, T, H)))  # the gradient of a replicated output
        return y.detach(), x.grad, x.detach(), forward, calls(comm)

    total = sum(integers(52, r, (B, T, H)) for r in range(t))
    for rank, (y, dx, x_after, forward, backward) in enumerate(run_graded(on_rank, t)):
        assert_matches_reference(y, total, name="g forward (sum over ranks)", rank=rank, exact=True)
        assert_matches_reference(dx, integers(53, 0, (B, T, H)), name="g backward (identity)", rank=rank, exact=True)
        assert_matches_reference(x_after, integers(52, rank, (B, T, H)), name="g input (must not change)",
                                 rank=rank, exact=True)
        check_calls(forward, {"all_reduce": 1}, "g forward", rank, t)
        check_calls(backward, {}, "g backward", rank, t)


@pytest.mark.parametrize("t", WORLD_SIZES)
def test_scatter_keeps_own_chunk_forward_and_all_gathers_backward(impl, t):
    n = H // t

    def on_rank(comm):
        x = integers(54, 0, (B, T, H)).requires_grad_()  # replicated
        comm.meter.reset()
        y = impl.ScatterToTensorParallelRegion.apply(comm, x)
        forward = calls(comm)
        # this rank's chunk is its own tensor (t = 1 too): a view of x (x[..., chunk]) would let
        # a write into the chunk change the replicated x
        assert_not_aliased(y, [x], "scatter's forward output", comm.rank)
        backward_with(y, integers(55, comm.rank, (B, T, n)))  # the gradient of this rank's chunk
        assert torch.equal(x.detach(), integers(54, 0, (B, T, H))), "scatter modified its input"
        return y.detach().clone(), x.grad, forward, calls(comm)

    x = integers(54, 0, (B, T, H))
    gathered = torch.cat([integers(55, r, (B, T, n)) for r in range(t)], dim=-1)
    for rank, (y, dx, forward, backward) in enumerate(run_graded(on_rank, t)):
        assert_matches_reference(y, x[..., rank * n:(rank + 1) * n], name="scatter forward (own chunk)",
                                 rank=rank, exact=True)
        assert_matches_reference(dx, gathered, name="scatter backward (all-gather)", rank=rank, exact=True)
        check_calls(forward, {}, "scatter forward", rank, t)
        check_calls(backward, {"all_gather": 1}, "scatter backward", rank, t)


@pytest.mark.parametrize("t", WORLD_SIZES)
def test_gather_all_gathers_forward_and_keeps_own_chunk_backward(impl, t):
    n = H // t

    def on_rank(comm):
        x = integers(56, comm.rank, (B, T, n)).requires_grad_()
        comm.meter.reset()
        y = impl.GatherFromTensorParallelRegion.apply(comm, x)
        forward = calls(comm)
        assert_not_aliased(y, [x], "gather's forward output", comm.rank)  # t = 1 too
        backward_with(y, integers(57, 0, (B, T, H)))  # replicated gradient of the full output
        assert torch.equal(x.detach(), integers(56, comm.rank, (B, T, n))), "gather modified its input"
        return y.detach(), x.grad, forward, calls(comm)

    gathered = torch.cat([integers(56, r, (B, T, n)) for r in range(t)], dim=-1)
    dy = integers(57, 0, (B, T, H))
    for rank, (y, dx, forward, backward) in enumerate(run_graded(on_rank, t)):
        assert_matches_reference(y, gathered, name="gather forward (all-gather)", rank=rank, exact=True)
        assert_matches_reference(dx, dy[..., rank * n:(rank + 1) * n], name="gather backward (own chunk)",
                                 rank=rank, exact=True)
        check_calls(forward, {"all_gather": 1}, "gather forward", rank, t)
        check_calls(backward, {}, "gather backward", rank, t)


# -- the parallel linear layers against torch.nn.Linear ------------------------------------

def single_device_linear(seed, in_features, out_features, dtype):
    """An nn.Linear with random weights from numpy (no shared torch RNG between threads)."""
    rng = rank_rng(seed, 0)
    linear = torch.nn.Linear(in_features, out_features, dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(tensor(random_array(rng, (out_features, in_features)), dtype))
        linear.bias.copy_(tensor(random_array(rng, (out_features,)), dtype))
    return linear


def run_layer(comm, seed, dtype, make_layer, x_of, dy_of):
    """Build the single-device and the parallel layer, run forward, backward and one SGD step.

    Returns everything the test compares, plus the collective calls forward and backward.
    """
    reference = single_device_linear(seed, H, F, dtype) if make_layer[0] == "column" else \
        single_device_linear(seed, F, H, dtype)
    source = {name: p.detach().clone() for name, p in reference.named_parameters()}
    layer = make_layer[1](reference, comm)
    rng = rank_rng(seed + 1, 0)
    x_full = random_array(rng, (B, T, reference.in_features))
    dy_full = tensor(random_array(rng, (B, T, reference.out_features)), dtype)
    x_ref, x = tensor(x_full, dtype, True), tensor(x_of(x_full, comm.rank), dtype, True)
    y_ref = reference(x_ref)
    (y_ref * dy_full).sum().backward()
    comm.meter.reset()
    y = layer(x)
    forward = calls(comm)
    dy = dy_of(dy_full, comm.rank).detach().clone()
    backward_with(y, dy)
    backward = calls(comm)
    grads = (x.grad, layer.weight.grad, layer.bias.grad)
    # one SGD step on the parallel layer only: the single-device layer it was built from
    # must not move (a from_linear that shares storage with it would drag it along)
    with torch.no_grad():  # SGD by hand, in place as torch.optim.SGD does (building one imports torch._dynamo: seconds)
        for p in layer.parameters():
            p -= 0.1 * p.grad
    for name, p in reference.named_parameters():
        assert torch.equal(p.detach(), source[name]), (
            f"rank {comm.rank}: an optimizer step on the parallel layer changed the source nn.Linear's "
            f"{name}: from_linear must copy the shard (e.g. .clone()), not keep a view of it")
    with torch.no_grad():
        w_ref, b_ref = (source["weight"] - 0.1 * reference.weight.grad, source["bias"] - 0.1 * reference.bias.grad)
    return dict(y=y.detach(), y_ref=y_ref.detach(), dx=grads[0], dx_ref=x_ref.grad, dw=grads[1],
                dw_ref=reference.weight.grad, db=grads[2], db_ref=reference.bias.grad,
                w=layer.weight.detach(), w_ref=w_ref, b=layer.bias.detach(),
                b_ref=b_ref, bias_full=source["bias"], forward=forward, backward=backward)


def compare(r, rank, y_ref, dx_ref, rows, cols, bias_block, what, t=1):
    """This rank's block of every single-device quantity, after one optimizer step too."""
    try:
        assert_matches_reference(r["y"], y_ref, name=f"{what} Y", rank=rank)
    except AssertionError as error:
        extra = r["y"].double() - y_ref.double() - (t - 1) * r["bias_full"].double()
        if t > 1 and what == "row-parallel" and extra.abs().max() < 1e-4 * max(1.0, y_ref.abs().max().item()):
            raise AssertionError(f"{error}\nHint: Y - Y_ref = (t-1)*b: the bias was added on every rank "
                                 "before the all-reduce. Add it once, after the reduction") from None
        raise
    assert_matches_reference(r["dx"], dx_ref, name=f"{what} dX", rank=rank)
    assert_matches_reference(r["dw"], r["dw_ref"][rows, cols], name=f"{what} dW (local shard)", rank=rank)
    assert_matches_reference(r["db"], r["db_ref"][bias_block], name=f"{what} db", rank=rank)
    assert_matches_reference(r["w"], r["w_ref"][rows, cols], name=f"{what} W after an SGD step", rank=rank)
    assert_matches_reference(r["b"], r["b_ref"][bias_block], name=f"{what} b after an SGD step", rank=rank)


@pytest.mark.parametrize("gather_output", [False, True])
@pytest.mark.parametrize("t", WORLD_SIZES)
def test_column_parallel_linear_equals_nn_linear(impl, t, gather_output):
    n = F // t
    make = ("column", lambda linear, comm: impl.ColumnParallelLinear.from_linear(linear, group=comm, gather_output=gather_output))
    x_of = lambda x, rank: x  # noqa: E731  (replicated input)
    dy_of = lambda dy, rank: dy if gather_output else dy[..., rank * n:(rank + 1) * n]  # noqa: E731
    for dtype in (torch.float64, torch.float32):
        for rank, r in enumerate(run_graded(run_layer, t, 60, dtype, make, x_of, dy_of)):
            block = slice(rank * n, (rank + 1) * n)
            y_ref = r["y_ref"] if gather_output else r["y_ref"][..., block]
            compare(r, rank, y_ref, r["dx_ref"], block, slice(None), block, "column-parallel")
            check_calls(r["forward"], {"all_gather": 1} if gather_output else {}, "column forward", rank, t)
            check_calls(r["backward"], {"all_reduce": 1}, "column backward (f)", rank, t)


@pytest.mark.parametrize("input_is_parallel", [True, False])
@pytest.mark.parametrize("t", WORLD_SIZES)
def test_row_parallel_linear_equals_nn_linear(impl, t, input_is_parallel):
    n = F // t
    make = ("row", lambda linear, comm: impl.RowParallelLinear.from_linear(linear, group=comm, input_is_parallel=input_is_parallel))
    x_of = lambda x, rank: x[..., rank * n:(rank + 1) * n] if input_is_parallel else x  # noqa: E731
    dy_of = lambda dy, rank: dy  # noqa: E731  (the output is replicated)
    for dtype in (torch.float64, torch.float32):
        for rank, r in enumerate(run_graded(run_layer, t, 61, dtype, make, x_of, dy_of)):
            block = slice(rank * n, (rank + 1) * n)
            dx_ref = r["dx_ref"][..., block] if input_is_parallel else r["dx_ref"]
            # the bias is replicated and added once: its gradient is the full db on every rank
            compare(r, rank, r["y_ref"], dx_ref, slice(None), block, slice(None), "row-parallel", t)
            check_calls(r["forward"], {"all_reduce": 1}, "row forward (g)", rank, t)
            check_calls(r["backward"], {} if input_is_parallel else {"all_gather": 1}, "row backward", rank, t)


@pytest.mark.parametrize("t", [1, 3])
@pytest.mark.parametrize("kind", ["column", "row"])
def test_a_bias_free_layer_equals_nn_linear_without_bias(impl, kind, t):
    # the course's Llama (Lesson 6) has no biases: from_linear of nn.Linear(bias=False) must
    # give a layer with bias None (a zero bias would still be a parameter, and would train)
    n = F // t

    def on_rank(comm):
        shape = (F, H) if kind == "column" else (H, F)  # (out, in)
        linear = torch.nn.Linear(shape[1], shape[0], bias=False, dtype=torch.float64)
        with torch.no_grad():
            linear.weight.copy_(tensor(random_array(rank_rng(65, 0), shape)))
        if kind == "column":
            layer = impl.ColumnParallelLinear.from_linear(linear, group=comm)
        else:
            layer = impl.RowParallelLinear.from_linear(linear, group=comm)
        if layer.bias is not None:
            raise AssertionError(
                f"rank {comm.rank}: {kind}-parallel from_linear of an nn.Linear without bias made a bias "
                f"{tuple(layer.bias.shape)}: keep bias None (the course's Llama has none), or it trains")
        x_full = random_array(rank_rng(66, 0), (B, T, shape[1]))
        x_ref = tensor(x_full, grad=True)
        x = tensor(x_full if kind == "column" else x_full[..., comm.rank * n:(comm.rank + 1) * n], grad=True)
        y_ref, y = linear(x_ref), layer(x)
        dy_full = tensor(random_array(rank_rng(67, 0), (B, T, shape[0])))
        (y_ref * dy_full).sum().backward()
        (y * (dy_full[..., comm.rank * n:(comm.rank + 1) * n] if kind == "column" else dy_full)).sum().backward()
        return y.detach(), y_ref.detach(), x.grad, x_ref.grad, layer.weight.grad, linear.weight.grad

    for rank, (y, y_ref, dx, dx_ref, dw, dw_ref) in enumerate(run_graded(on_rank, t)):
        block = slice(rank * n, (rank + 1) * n)
        what = f"bias-free {kind}-parallel"
        assert_matches_reference(y, y_ref[..., block] if kind == "column" else y_ref, name=f"{what} Y", rank=rank)
        assert_matches_reference(dx, dx_ref if kind == "column" else dx_ref[..., block], name=f"{what} dX", rank=rank)
        assert_matches_reference(dw, dw_ref[block] if kind == "column" else dw_ref[:, block],
                                 name=f"{what} dW (local shard)", rank=rank)


@pytest.mark.parametrize("t", WORLD_SIZES)
def test_column_then_row_is_the_megatron_mlp_with_one_all_reduce_each_way(impl, t):
    def on_rank(comm):
        fc, proj = single_device_linear(62, H, F, torch.float64), single_device_linear(63, F, H, torch.float64)
        fc_tp = impl.ColumnParallelLinear.from_linear(fc, group=comm)
        proj_tp = impl.RowParallelLinear.from_linear(proj, group=comm)
        x_full = random_array(rank_rng(64, 0), (B, T, H))
        x_ref, x = tensor(x_full, grad=True), tensor(x_full, grad=True)
        y_ref = proj(torch.nn.functional.gelu(fc(x_ref)))
        y_ref.sum().backward()
        comm.meter.reset()
        y = proj_tp(torch.nn.functional.gelu(fc_tp(x)))  # nothing moves between the two layers
        forward = calls(comm)
        y.sum().backward()
        return y.detach(), y_ref.detach(), x.grad, x_ref.grad, forward, calls(comm)

    for rank, (y, y_ref, dx, dx_ref, forward, backward) in enumerate(run_graded(on_rank, t)):
        assert_matches_reference(y, y_ref, name="MLP Y", rank=rank)
        assert_matches_reference(dx, dx_ref, name="MLP dX", rank=rank)
        check_calls(forward, {"all_reduce": 1}, "MLP forward", rank, t)
        check_calls(backward, {"all_reduce": 1}, "MLP backward", rank, t)
