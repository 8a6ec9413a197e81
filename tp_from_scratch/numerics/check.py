"""Lesson 13's claims, checked on one rank's group: simulated ranks, under mpiexec or under torchrun.

    .venv/bin/mpiexec -n 4 .venv/bin/python -m tp_from_scratch.numerics.check
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.numerics.check

At t = the world size, and each compared bit for bit with t = 1, computed in this process on
one simulated rank (the same code with the whole of every tensor):

* check_tree: tree.tree_all_reduce of every rank's leaves equals the tree over all the leaves,
  on every rank, in float32 and float64, and the meter shows tree_traffic (log2 t messages);
* check_tree_torch: reduction.tree_all_reduce, on a Comm and on a ProcessGroup (torchrun), also
  in bfloat16 (added in float32, rounded once);
* check_layers: the invariant column (also with a KV head on several ranks), row, LM-head and
  cross-entropy outputs and every gradient.
Started without a launcher, `.venv/bin/python -m tp_from_scratch.numerics.check`, it runs on 1, 2, 4
and 8 simulated ranks.
"""
import functools
import sys

import numpy as np
import torch

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.comm.launch import check_main
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.nn.mappings import tp_rank, tp_world_size
from tp_from_scratch.numerics import reduction, tree
from tp_from_scratch.numerics.cross_entropy import invariant_vocab_parallel_cross_entropy
from tp_from_scratch.numerics.layers import InvariantColumnParallelLinear, InvariantRowParallelLinear, invariant_lm_head
from tp_from_scratch.testing import random_array, rank_rng

LEAVES = tree.DEFAULT_LEAVES
SHAPES = [(), (7, 5), (1001,)]


def all_leaves(seed, shape, dtype, n_leaves=LEAVES):
    """(n_leaves, *shape): every leaf, drawn from its own stream, so any rank can draw them all."""
    return np.stack([random_array(rank_rng(seed, leaf), shape, dtype) for leaf in range(n_leaves)])


def check_tree(comm):
    """tree_all_reduce on ``comm`` == the t = 1 tree over all leaves, bit for bit, with its traffic."""
    t, r = comm.world_size, comm.rank
    here = LEAVES // t
    for shape in SHAPES:
        for dtype in (np.float32, np.float64):
            leaves = all_leaves(1300, shape, dtype)
            want = tree.local_tree_sum(leaves)                 # t = 1: the whole tree on one rank
            comm.meter.reset()
            got = tree.tree_all_reduce(comm, leaves[r * here:(r + 1) * here])
            traffic = (comm.meter.messages_sent, comm.meter.bytes_sent)
            assert traffic == tree.tree_traffic(t, want.nbytes), \
                f"rank {r}: tree_all_reduce sent {traffic}, tree_traffic says {tree.tree_traffic(t, want.nbytes)}"
            assert_matches_reference(got, want, name=f"tree_all_reduce t={t} {shape} {np.dtype(dtype).name}",
                                     rank=r, exact=True)
    return len(SHAPES) * 2


def check_tree_torch(group):
    """reduction.tree_all_reduce on ``group`` (a Comm or a ProcessGroup) == the t = 1 tree, bit for bit."""
    t, r = tp_world_size(group), tp_rank(group)
    here = LEAVES // t
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        leaves = torch.from_numpy(all_leaves(1301, (33,), np.float64)).to(dtype)
        want = tree.local_tree_sum(leaves.to(reduction.accumulation_dtype(dtype))).to(dtype)
        got = reduction.tree_all_reduce(group, leaves[r * here:(r + 1) * here])
        assert_matches_reference(got, want, name=f"torch tree_all_reduce t={t} {dtype}", rank=r, exact=True)
    return 3


def layer_outputs(group, world, seed=1302, tokens=(2, 16), features=(64, 32), vocab=64, kv_heads=2):
    """Every output and gradient of the invariant layers on ``group``: this rank's pieces, float32.

    ``world``: the t being checked. At t = world the KV layer holds each of its ``kv_heads`` heads
    on world / kv_heads ranks (when world > kv_heads), each with its own query head's dY; on fewer
    ranks a head's dY is their sum in rank order, as repeat_interleave's backward adds them.
    """
    t, r = tp_world_size(group), tp_rank(group)
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    n_in, n_out = features
    linears = {"column": torch.nn.Linear(n_in, n_out), "kv": torch.nn.Linear(n_in, n_out),
               "row": torch.nn.Linear(n_out, n_in)}
    with torch.no_grad():
        for linear in linears.values():
            linear.weight.copy_(randn(*linear.weight.shape))
            linear.bias.copy_(randn(*linear.bias.shape))
    x, x_row = randn(*tokens, n_in), randn(*tokens, n_out)
    dy = {"column": randn(*tokens, n_out), "row": randn(*tokens, n_in)}
    replicas = max(1, world // kv_heads)
    per_query = [randn(*tokens, n_out // kv_heads) for _ in range(kv_heads * replicas)]  # query head q's dY
    heads = []
    for h in range(kv_heads):
        total = per_query[h * replicas]
        for k in range(1, replicas):
            total = total + per_query[h * replicas + k]
        heads.append(total)
    dy["kv"] = torch.cat(heads, -1)
    head_weight, target = randn(vocab, n_in), torch.randint(0, vocab, (tokens[0] * tokens[1],), generator=gen)
    out = {}
    for name in ("column", "kv"):
        xg = x.clone().requires_grad_()
        here = max(1, t // kv_heads) if name == "kv" else 1
        layer = InvariantColumnParallelLinear.from_linear(linears[name], group=group, replicas=here)
        y = layer(xg)
        cotangent = per_query[r] if here > 1 else dy[name].tensor_split(t, -1)[r]
        (y * cotangent).sum().backward()
        out.update({f"{name} y": y, f"{name} dx": xg.grad, f"{name} dw": layer.weight.grad,
                    f"{name} db": layer.bias.grad})
    xg = x_row.tensor_split(t, -1)[r].clone().requires_grad_()
    layer = InvariantRowParallelLinear.from_linear(linears["row"], group=group)
    y = layer(xg)
    (y * dy["row"]).sum().backward()
    out.update({"row y": y, "row dx": xg.grad, "row dw": layer.weight.grad, "row db": layer.bias.grad})
    h = x.clone().requires_grad_()
    weight = head_weight.tensor_split(t, 0)[r].clone().requires_grad_()
    logits = invariant_lm_head(group, h, weight, vocab)
    loss = invariant_vocab_parallel_cross_entropy(group, logits.flatten(0, 1), target, vocab_start=r * vocab // t)
    loss.backward()
    out.update({"head logits": logits, "loss": loss, "head dh": h.grad, "head dw": weight.grad})
    return {name: value.detach() for name, value in out.items()}


@functools.lru_cache(maxsize=8)
def reference_outputs(world, kv_heads):
    """layer_outputs at t = 1 for a check at t = world, on one simulated rank in this process (kept:
    every group checked here at that t compares with the same tensors, which nothing modifies)."""
    return run_spmd(layer_outputs, 1, world, kv_heads=kv_heads)[0]


def sharded_like(name, full, t, r, replicas):
    """This rank's piece of a t = 1 result: the column layers' outputs and weights are split on
    their out axis (a replicated KV head: its head's piece), the row layer's dX and dW on in."""
    if name in ("column y", "column dw", "column db", "head logits", "head dw") or \
            (name in ("kv y", "kv dw", "kv db") and replicas == 1):
        axis = 0 if name.endswith(("dw", "db")) else -1
        return full.tensor_split(t, axis)[r]
    if name in ("kv y", "kv dw", "kv db"):
        axis = 0 if name.endswith(("dw", "db")) else -1
        return full.tensor_split(t // replicas, axis)[r // replicas]
    if name in ("row dx", "row dw"):
        return full.tensor_split(t, -1)[r]
    return full                                      # replicated: the whole result on every rank


def check_layers(group, kv_heads=2):
    """Every output and gradient of the invariant layers at t == their t = 1 pieces, bit for bit."""
    t, r = tp_world_size(group), tp_rank(group)
    got = layer_outputs(group, t, kv_heads=kv_heads)
    want = reference_outputs(t, kv_heads)
    replicas = max(1, t // kv_heads)
    for name, value in got.items():
        assert_matches_reference(value, sharded_like(name, want[name], t, r, replicas), name=f"{name} at t={t}",
                                 rank=r, exact=True)
    return len(got)


def report(comm):
    """Every check on ``comm`` (and, under torchrun, on the native process group); one line per rank."""
    n = check_tree(comm) + check_tree_torch(comm) + check_layers(comm)
    also = ""
    if type(comm).__name__ == "TorchComm":
        import torch.distributed as dist
        n += check_tree_torch(dist.group.WORLD) + check_layers(dist.group.WORLD)
        also = ", and on the native process group"
    sys.stdout.write(f"rank {comm.rank}: all {n} numerics checks passed at t={comm.world_size} "
                     f"({type(comm).__name__}{also})\n")
    sys.stdout.flush()


if __name__ == "__main__":
    check_main(report, world_sizes=(1, 2, 4, 8))
