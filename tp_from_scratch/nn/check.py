"""Every tensor-parallel layer against its single-device twin: output, all gradients, one step.

Each check runs on one rank and takes that rank's ``group`` first (a ProcessGroup or a Comm),
so the same code runs on in-process simulated ranks (tests, exercises, Lesson 5) and on real
processes. Every rank builds the same full single-device layer and data from one seed, runs
it, and compares its own shard of every result through assert_matches_reference.

Under torchrun, on any number of processes (CPU gloo; CUDA nccl with --device cuda):

    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.nn.check
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.nn.check --device cuda

which runs every check with native collectives (the process group itself) and with
from-scratch ones (a TorchComm over the same group), on the whole world and on sub-groups,
and prints one line per rank.
"""
import argparse
import contextlib
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.nn.cross_entropy import vocab_parallel_cross_entropy
from tp_from_scratch.nn.embedding import VocabParallelEmbedding
from tp_from_scratch.comm.launch import torch_main
from tp_from_scratch.comm.process_group import local_device, new_group
from tp_from_scratch.comm.torch_comm import TorchComm
from tp_from_scratch.nn.linear import ColumnParallelLinear, RowParallelLinear
from tp_from_scratch.nn.mappings import all_gather, all_reduce, tp_rank, tp_world_size
from tp_from_scratch.sharding import shard_range
from tp_from_scratch.nn.random import TensorParallelRNG
from tp_from_scratch.testing import random_array, rank_rng

OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1),
}


def _tensor(array, dtype, device, grad=False):
    return torch.tensor(array, dtype=dtype, device=device, requires_grad=grad)


def _linear(w, b, dtype, device):
    """A single-device nn.Linear holding the given numpy (out, in) weight and bias (no RNG use)."""
    layer = nn.utils.skip_init(nn.Linear, w.shape[1], w.shape[0], bias=b is not None,
                               dtype=dtype, device=device)
    with torch.no_grad():
        layer.weight.copy_(_tensor(w, dtype, device))
        if b is not None:
            layer.bias.copy_(_tensor(b, dtype, device))
    return layer


def _step(module, optimizer):
    OPTIMIZERS[optimizer](list(module.parameters())).step()


def _step_apart(judge, rank, layer, reference, optimizer):
    """Step the parallel layer, check that its single-device source did not move with it (the
    shard must be a copy, not a view), then step the source too."""
    kept = [p.detach().clone() for p in reference.parameters()]
    _step(layer, optimizer)
    for (name, p), before in zip(reference.named_parameters(), kept):
        judge.match(p.detach(), before, name=f"source {name} untouched by the layer's step",
                    rank=rank, exact=True)
    _step(reference, optimizer)


class Strict:
    """How a check reports: raise at the first mismatch (tests, exercises, this module's torchrun run).

    tp_from_scratch.verify hands the checks a recording judge instead, with the same three
    methods: it keeps every measurement, counts the collectives of each ``phase`` and lets
    the check run to its end.
    """

    def match(self, got, expected, *, name, rank, exact=False):
        assert_matches_reference(got, expected, name=name, rank=rank, exact=exact)

    def holds(self, ok, *, name, rank, why):
        if not ok:
            raise AssertionError(f"{name} on rank {rank}: {why}")

    def phase(self, name):
        """A block of the parallel computation ("forward", "backward"); nothing to do here."""
        return contextlib.nullcontext()

    def exclusive(self):
        """A block that draws from torch's default RNG, which simulated ranks (threads) share."""
        return contextlib.nullcontext()


def _storage(x):
    x = x.to_local() if hasattr(x, "to_local") else x  # a DTensor: this rank's shard
    x = x.trigger_wait() if hasattr(x, "trigger_wait") else x  # a collective's pending result
    return x.untyped_storage().data_ptr()


def _shares_memory(a, b):
    return _storage(a) == _storage(b)


def check_untouched_and_fresh(judge, rank, output, **inputs):
    """Every input tensor still holds its original values, and ``output`` shares memory with none.

    inputs: name -> (the tensor handed to the layer, a copy taken before the call).
    An in-place collective on an input (or on the gradient handed to backward) fails here.
    """
    for name, (tensor, original) in inputs.items():
        judge.match(tensor.detach(), original, name=f"{name} untouched", rank=rank, exact=True)
        judge.holds(not _shares_memory(output, tensor), name=f"output fresh ({name})", rank=rank,
                    why=f"the output shares memory with {name}")


def check_column_parallel_linear(group, dtype=torch.float64, seed=0, *, in_features=12,
                                 out_features=12, bias=True, gather_output=False, optimizer="sgd",
                                 device="cpu", layer_cls=ColumnParallelLinear, batch=(2, 3),
                                 layout=shard_range, judge=None, passes=1):
    """ColumnParallelLinear vs nn.Linear: Y (or Y's block), dX, dW block, db block, and one step.

    layer_cls: the class under test (an exercise's own ColumnParallelLinear, say).
    batch: the input's leading dims, (B, T) by default; layout(n, rank, t): this rank's block.
    judge: how mismatches are reported (Strict: raise at the first).
    passes: forward+backward passes before the step, each with its own dY; the gradients must
    accumulate (sum) over them, as nn.Linear's do.
    """
    judge = judge or Strict()
    rank, t = tp_rank(group), tp_world_size(group)
    rng = rank_rng(seed, 0)  # the layer and its input are the same on every rank
    w, b = random_array(rng, (out_features, in_features)), random_array(rng, (out_features,))
    x, dy = random_array(rng, (*batch, in_features)), random_array(rng, (*batch, out_features))
    reference = _linear(w, b if bias else None, dtype, device)
    layer = layer_cls.from_linear(reference, group=group, gather_output=gather_output)
    lo, hi = layout(out_features, rank, t)

    x_ref, x_tp = _tensor(x, dtype, device, True), _tensor(x, dtype, device, True)
    for dy in [dy] + [random_array(rng, dy.shape) for _ in range(passes - 1)]:
        y_ref = reference(x_ref)                   # (B, T, out)
        y_ref.backward(_tensor(dy, dtype, device))
        dy_tp = _tensor(dy if gather_output else dy[..., lo:hi], dtype, device)
        dy_kept = dy_tp.clone()
        with judge.phase("forward"):
            y_tp = layer(x_tp)                     # (B, T, out) or (B, T, out/t)
        with judge.phase("backward"):
            y_tp.backward(dy_tp)

    # the parallel layer must reproduce its block of every single-device quantity
    judge.match(y_tp, y_ref if gather_output else y_ref[..., lo:hi], name="Y", rank=rank)
    judge.match(x_tp.grad, x_ref.grad, name="dX (after f's all-reduce)", rank=rank)
    judge.match(layer.weight.grad, reference.weight.grad[lo:hi], name="dW", rank=rank)
    if bias:
        judge.match(layer.bias.grad, reference.bias.grad[lo:hi], name="db", rank=rank)
    check_untouched_and_fresh(judge, rank, y_tp, X=(x_tp, _tensor(x, dtype, device)), dY=(dy_tp, dy_kept))
    _step_apart(judge, rank, layer, reference, optimizer)
    judge.match(layer.weight, reference.weight[lo:hi], name=f"W after {optimizer}", rank=rank)
    if bias:
        judge.match(layer.bias, reference.bias[lo:hi], name=f"b after {optimizer}", rank=rank)


def check_row_parallel_linear(group, dtype=torch.float64, seed=0, *, in_features=12,
                              out_features=12, bias=True, input_is_parallel=True, optimizer="sgd",
                              device="cpu", layer_cls=RowParallelLinear, batch=(2, 3),
                              layout=shard_range, judge=None, passes=1):
    """RowParallelLinear vs nn.Linear: Y, dX (or its block), dW block, db (bias added once), one step.

    layer_cls: the class under test (an exercise's own RowParallelLinear, say).
    batch, layout, judge, passes: as for check_column_parallel_linear.
    """
    judge = judge or Strict()
    rank, t = tp_rank(group), tp_world_size(group)
    rng = rank_rng(seed, 0)
    w, b = random_array(rng, (out_features, in_features)), random_array(rng, (out_features,))
    x, dy = random_array(rng, (*batch, in_features)), random_array(rng, (*batch, out_features))
    reference = _linear(w, b if bias else None, dtype, device)
    layer = layer_cls.from_linear(reference, group=group, input_is_parallel=input_is_parallel)
    lo, hi = layout(in_features, rank, t)

    x_ref = _tensor(x, dtype, device, True)
    x_local = x[..., lo:hi] if input_is_parallel else x
    x_tp = _tensor(x_local, dtype, device, True)
    for dy in [dy] + [random_array(rng, dy.shape) for _ in range(passes - 1)]:
        y_ref = reference(x_ref)
        y_ref.backward(_tensor(dy, dtype, device))
        dy_tp = _tensor(dy, dtype, device)
        with judge.phase("forward"):
            y_tp = layer(x_tp)
        with judge.phase("backward"):
            y_tp.backward(dy_tp)

    judge.match(y_tp, y_ref, name="Y (after g's all-reduce)", rank=rank)
    dx_ref = x_ref.grad[..., lo:hi] if input_is_parallel else x_ref.grad
    judge.match(x_tp.grad, dx_ref, name="dX", rank=rank)
    judge.match(layer.weight.grad, reference.weight.grad[:, lo:hi], name="dW", rank=rank)
    if bias:
        judge.match(layer.bias.grad, reference.bias.grad, name="db", rank=rank)
    check_untouched_and_fresh(judge, rank, y_tp, X=(x_tp, _tensor(x_local, dtype, device)),
                              dY=(dy_tp, _tensor(dy, dtype, device)))
    _step_apart(judge, rank, layer, reference, optimizer)
    judge.match(layer.weight, reference.weight[:, lo:hi], name=f"W after {optimizer}", rank=rank)
    if bias:
        judge.match(layer.bias, reference.bias, name=f"b after {optimizer}", rank=rank)


def check_parallel_mlp(group, dtype=torch.float64, seed=0, *, hidden=8, ffn=12, device="cpu"):
    """Column then row (the Megatron MLP, GeLU between): Y and dX replicated, weight grads sharded."""
    rank, t = tp_rank(group), tp_world_size(group)
    rng = rank_rng(seed, 0)
    fc = _linear(random_array(rng, (ffn, hidden)), random_array(rng, (ffn,)), dtype, device)
    proj = _linear(random_array(rng, (hidden, ffn)), random_array(rng, (hidden,)), dtype, device)
    x, dy = random_array(rng, (2, 3, hidden)), random_array(rng, (2, 3, hidden))
    fc_tp = ColumnParallelLinear.from_linear(fc, group=group)
    proj_tp = RowParallelLinear.from_linear(proj, group=group)
    lo, hi = shard_range(ffn, rank, t)

    x_ref, x_tp = _tensor(x, dtype, device, True), _tensor(x, dtype, device, True)
    y_ref = proj(F.gelu(fc(x_ref)))
    y_tp = proj_tp(F.gelu(fc_tp(x_tp)))  # no communication between the two layers
    for y in (y_ref, y_tp):
        (y * _tensor(dy, dtype, device)).sum().backward()
    assert_matches_reference(y_tp, y_ref, name="MLP Y", rank=rank)
    assert_matches_reference(x_tp.grad, x_ref.grad, name="MLP dX", rank=rank)
    assert_matches_reference(fc_tp.weight.grad, fc.weight.grad[lo:hi], name="dW fc", rank=rank)
    assert_matches_reference(proj_tp.weight.grad, proj.weight.grad[:, lo:hi], name="dW proj", rank=rank)
    assert_matches_reference(proj_tp.bias.grad, proj.bias.grad, name="db proj", rank=rank)


def check_vocab_parallel_embedding(group, dtype=torch.float64, seed=0, *, vocab=13, dim=6,
                                   optimizer="sgd", device="cpu", layer_cls=VocabParallelEmbedding,
                                   ids_shape=(3, 5), padding_idx=None, layout=shard_range, judge=None,
                                   passes=1):
    """VocabParallelEmbedding vs nn.Embedding: rows (bit-exact), dE block, and one step.

    padding_idx: the reference nn.Embedding's (its row gets no gradient); the ids then also
    hold the row at the same offset inside every rank's block, which must get its gradient.
    layer_cls, layout, judge, passes: as for check_column_parallel_linear; ids_shape: the ids' shape.
    """
    judge = judge or Strict()
    rank, t = tp_rank(group), tp_world_size(group)
    rng = rank_rng(seed, 0)
    table = random_array(rng, (vocab, dim))
    ids = rng.integers(0, vocab, size=ids_shape)
    if padding_idx is not None:  # the padding row, and its local offset in every rank's block
        mirrors = [layout(vocab, r, t)[0] + padding_idx for r in range(t)]
        mirrors = [padding_idx] + [i for i in mirrors if i < vocab]
        ids.reshape(-1)[:len(mirrors)] = mirrors
    ids = torch.tensor(ids, device=device)
    dy = _tensor(random_array(rng, (*ids_shape, dim)), dtype, device)
    reference = nn.Embedding.from_pretrained(_tensor(table, dtype, device), freeze=False,
                                             padding_idx=padding_idx)
    layer = layer_cls.from_embedding(reference, group=group)
    lo, hi = layout(vocab, rank, t)

    more = [_tensor(random_array(rng, tuple(dy.shape)), dtype, device) for _ in range(passes - 1)]
    for dy in [dy] + more:
        reference(ids).backward(dy)
        ids_kept, dy_kept = ids.clone(), dy.clone()
        with judge.phase("forward"):
            out = layer(ids)
        with judge.phase("backward"):
            out.backward(dy)
    # one real row plus t-1 zeros: the all-reduce must give every bit back
    judge.match(out, reference(ids), name="embedding rows", rank=rank, exact=True)
    judge.match(layer.weight.grad, reference.weight.grad[lo:hi], name="dE", rank=rank)
    check_untouched_and_fresh(judge, rank, out, ids=(ids, ids_kept), dY=(dy, dy_kept))
    _step_apart(judge, rank, layer, reference, optimizer)
    judge.match(layer.weight, reference.weight[lo:hi], name=f"E after {optimizer}", rank=rank)


def _cross_entropy(group, local_logits, target, ignore_index, vocab_start):
    return vocab_parallel_cross_entropy(group, local_logits, target, ignore_index,
                                        vocab_start=vocab_start)


def check_vocab_parallel_cross_entropy(group, dtype=torch.float64, seed=0, *, vocab=13,
                                       scale=1.0, ignore_index=-100, vocab_start_given=True,
                                       device="cpu", loss_fn=_cross_entropy, layout=shard_range,
                                       ignored=0.2, judge=None, batch=(3, 5)):
    """vocab_parallel_cross_entropy vs F.cross_entropy: the loss and this rank's logit-gradient block.

    batch: the logits' leading dims, (B, T) by default: logits (*batch, V), targets (*batch).

    scale: multiplies the logits; large values (1e3) overflow exp() without the max subtraction.
    A fraction ``ignored`` of the targets are ignore_index; the mean runs over the others.
    loss_fn(group, local_logits, target, ignore_index, vocab_start): the function under test.
    """
    judge = judge or Strict()
    rank, t = tp_rank(group), tp_world_size(group)
    rng = rank_rng(seed, 0)
    logits = scale * random_array(rng, (*batch, vocab))        # (B, T, V)
    target = rng.integers(0, vocab, size=batch)
    target[rng.random(batch) < ignored] = ignore_index
    target = torch.tensor(target, device=device)
    lo, hi = layout(vocab, rank, t)

    z_ref = _tensor(logits, dtype, device, True)
    loss_ref = F.cross_entropy(z_ref.reshape(-1, vocab), target.reshape(-1), ignore_index=ignore_index)
    loss_ref.backward()
    z_local = _tensor(logits[..., lo:hi], dtype, device, True)  # (B, T, V/t), never gathered
    target_kept = target.clone()
    with judge.phase("forward"):
        loss = loss_fn(group, z_local, target, ignore_index, lo if vocab_start_given else None)
    with judge.phase("backward"):
        loss.backward()
    judge.match(loss, loss_ref, name="loss", rank=rank)
    judge.match(z_local.grad, z_ref.grad[..., lo:hi], name="d loss / d logits", rank=rank)
    check_untouched_and_fresh(judge, rank, loss, logits=(z_local, _tensor(logits[..., lo:hi], dtype, device)),
                              target=(target, target_kept))


def check_dropout_rng(group, dtype=torch.float64, seed=0, *, p=0.5, device="cpu"):
    """Replicated-stream masks are identical on every rank; sharded-stream masks all differ."""
    rank, t = tp_rank(group), tp_world_size(group)
    rng = TensorParallelRNG(seed, group=group, device=device)
    ones = torch.ones(4, 16, dtype=dtype, device=device)
    # gather every rank's mask side by side, (4, 16 t), to compare them here
    replicated = all_gather(group, rng.dropout(ones, p, sharded=False)).chunk(t, dim=-1)
    sharded = all_gather(group, rng.dropout(ones, p, sharded=True)).chunk(t, dim=-1)
    for other in range(t):
        assert_matches_reference(replicated[other], replicated[rank], exact=True, rank=rank,
                                 name=f"replicated dropout mask of rank {other}")
        if other != rank and torch.equal(sharded[other], sharded[rank]):
            raise AssertionError(f"rank {rank}: sharded dropout mask equals rank {other}'s")
    kept = float((sharded[rank] != 0).to(torch.float64).mean())
    if not 0.2 < kept < 0.8:  # 64 draws at p = 0.5: outside this range by chance < 1e-5
        raise AssertionError(f"rank {rank}: dropout kept {kept:.2f} of the elements at p={p}")


def _our_layers(group, dtype, device, n, vocab):
    return {"column": lambda: ColumnParallelLinear(6, n, group=group, dtype=dtype, device=device),
            "row": lambda: RowParallelLinear(n, 6, group=group, dtype=dtype, device=device),
            "embedding": lambda: VocabParallelEmbedding(vocab, 4, group=group, dtype=dtype, device=device)}


def check_default_init(group, dtype=torch.float32, seed=0, device="cpu", *, layers=None,
                       sizes=(10, 13), layout=shard_range, judge=None):
    """With the same seed, default-initialised parallel layers hold their shards of nn.Linear / nn.Embedding.

    layers: {"column": make, "row": make, "embedding": make}, each make() building a default-
    initialised ColumnParallelLinear(6, n), RowParallelLinear(n, 6), VocabParallelEmbedding(V, 4)
    for sizes=(n, V) (ours when None; a missing entry is not checked). Uses torch's default RNG, which simulated
    ranks (threads) share: run it on real processes, on one simulated rank, or with a judge
    whose exclusive() lets one rank draw at a time.
    """
    judge = judge or Strict()
    rank, t = tp_rank(group), tp_world_size(group)
    n, vocab = sizes
    makers = dict(_our_layers(group, dtype, device, n, vocab) if layers is None else layers)
    makers.update({"linear 6->n": lambda: nn.Linear(6, n, dtype=dtype, device=device),
                   "linear n->6": lambda: nn.Linear(n, 6, dtype=dtype, device=device),
                   "nn.Embedding": lambda: nn.Embedding(vocab, 4, dtype=dtype, device=device)})
    built = {}
    with judge.exclusive():
        for name, make in makers.items():
            torch.manual_seed(seed)
            built[name] = make()
    (lo, hi), (vlo, vhi) = layout(n, rank, t), layout(vocab, rank, t)
    pairs = {}
    if "column" in built:
        pairs["column W"] = (built["column"].weight, built["linear 6->n"].weight[lo:hi])
        pairs["column b"] = (built["column"].bias, built["linear 6->n"].bias[lo:hi])
    if "row" in built:
        pairs["row W"] = (built["row"].weight, built["linear n->6"].weight[:, lo:hi])
        pairs["row b"] = (built["row"].bias, built["linear n->6"].bias)
    if "embedding" in built:
        pairs["embedding E"] = (built["embedding"].weight, built["nn.Embedding"].weight[vlo:vhi])
    for name, (got, expected) in pairs.items():
        judge.match(got, expected, name=f"default init, {name}", rank=rank, exact=True)


def all_checks():
    """(name, function, kwargs) for every check, sized to cover uneven splits for t = 1..4."""
    checks = []
    for gather in (False, True):
        for opt in OPTIMIZERS:
            checks.append((f"column gather_output={gather} {opt}", check_column_parallel_linear,
                           dict(gather_output=gather, optimizer=opt)))
    checks.append(("column uneven out=10 no bias", check_column_parallel_linear,
                   dict(out_features=10, bias=False, gather_output=True)))
    for parallel in (True, False):
        for opt in OPTIMIZERS:
            checks.append((f"row input_is_parallel={parallel} {opt}", check_row_parallel_linear,
                           dict(input_is_parallel=parallel, optimizer=opt)))
    checks.append(("row uneven in=10", check_row_parallel_linear,
                   dict(in_features=10, input_is_parallel=False)))
    checks.append(("mlp", check_parallel_mlp, {}))
    for opt in OPTIMIZERS:
        checks.append((f"embedding V=13 {opt}", check_vocab_parallel_embedding, dict(optimizer=opt)))
    checks.append(("cross-entropy V=13", check_vocab_parallel_cross_entropy, {}))
    checks.append(("cross-entropy large logits, vocab_start found", check_vocab_parallel_cross_entropy,
                   dict(scale=1e3, vocab_start_given=False)))
    checks.append(("cross-entropy ignore_index=0", check_vocab_parallel_cross_entropy,
                   dict(ignore_index=0)))
    checks.append(("dropout rng", check_dropout_rng, {}))
    return checks


def run_all_checks(group, dtypes=(torch.float64, torch.float32), seed=0, device="cpu"):
    """Run every check in every dtype on this rank; return the number run (raises on a mismatch)."""
    count = 0
    for dtype in dtypes:
        for name, check, kwargs in all_checks():
            try:
                check(group, dtype, seed, device=device, **kwargs)
            except AssertionError as error:
                raise AssertionError(f"{name} ({dtype}): {error}") from error
            count += 1
    return count


def _pairs(size):
    """This rank's TP group of 2 when the world is cut into consecutive pairs (a dp x tp mesh).

    Every rank must take part in creating every group, even one it does not belong to.
    """
    groups = [new_group(range(i, i + 2)) for i in range(0, size - 1, 2)]
    return groups[dist.get_rank() // 2] if dist.get_rank() < 2 * len(groups) else None


def check_native_equals_scratch(process_group, comm, seed=0, device="cpu"):
    """PyTorch's collectives (on ``process_group``) and the from-scratch ones (on ``comm``, a
    TorchComm over the same ranks) give the same results.

    Integer-valued data: every sum is exact in any order, so the two must agree bit for bit.
    """
    rank, t = tp_rank(process_group), tp_world_size(process_group)
    x = _tensor(random_array(rank_rng(seed, rank), (3, 4 + rank % 2), integer=True),
                torch.float64, device)
    sizes = [4 + r % 2 for r in range(t)]  # uneven shards: 4, 5, 4, 5, ...
    results = {}
    for name, group in (("native", process_group), ("scratch", comm)):
        results[name] = [all_reduce(group, x[:, :4]), all_reduce(group, x[:, :4], op="max"),
                         all_gather(group, x, -1, sizes)]
    for what, native, scratch in zip(("all-reduce sum", "all-reduce max", "all-gather"),
                                     results["native"], results["scratch"]):
        assert_matches_reference(scratch, native, name=f"{what}, scratch vs native", rank=rank, exact=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds any collective may wait")
    args = parser.parse_args(argv)
    torch_main(lambda: check_all(local_device(args.device), args.timeout), args.device, args.timeout)


def check_all(device, timeout):
    """Every check on the world group, native and from scratch (a TorchComm over it), and on a
    sub-group of 2; each rank prints one line."""
    rank, size = dist.get_rank(), dist.get_world_size()
    world = dist.group.WORLD
    counts = {}
    scratch = TorchComm(world, device=device, timeout=timeout)
    check_native_equals_scratch(world, scratch, device=device)
    check_default_init(world, device=device)
    counts[f"native, world group of {size}"] = run_all_checks(world, device=device)
    # one dtype: the scratch path moves the same bytes
    counts[f"scratch, world group of {size}"] = run_all_checks(scratch, (torch.float64,), device=device)
    pair = _pairs(size) if size > 2 else None
    if pair is not None:
        pair_scratch = TorchComm(pair, timeout=timeout)
        for name, group in (("native", pair), ("scratch", pair_scratch)):
            counts[f"{name}, sub-group of 2"] = run_all_checks(group, (torch.float32,), device=device)
    # one write per rank, so the ranks' lines do not interleave in a shared pipe
    sys.stdout.write(f"rank {rank}: all checks passed: native equals scratch; default init equals "
                     f"nn.Linear; " + "; ".join(f"{n} checks ({where})" for where, n in counts.items()) + "\n")
    sys.stdout.flush()

if __name__ == "__main__":
    main()
