"""What changes the bits when t changes, measured on this machine: the lesson's numbers.

    row_parallel_bits      the plain row-parallel matmul (a BLAS matmul per shard, the ring) and
                           the fixed tree, against one device, at t = 1, 2, 4, 8
    ring_chunk_orders      which rank's value comes first in each chunk's sum in Lesson 2's ring
    matmul_slice_bits      F.linear and invariant_linear on row and column slices
    head_count_bits        attention's per-head bmm and softmax with nh/t heads per rank
    elementwise_tail_bits  element-wise kernels on tensors whose length is not a multiple of the
                           vector loop's step (elementwise_step)
    breaking_variants      the tree with a ring, or with a sequential sum inside a rank, in its place
    one_row_shard_bits     BLAS at a shard of one vocabulary row, against invariant_linear

Each returns plain Python values (dicts of booleans and floats), recomputed whenever called.
"""
import numpy as np
import torch
import torch.nn.functional as F

from tp_from_scratch import collectives
from tp_from_scratch.comm import run_spmd
from tp_from_scratch.numerics import tree
from tp_from_scratch.numerics.matmul import invariant_linear
from tp_from_scratch.overlap.algorithms import all_reduce_recursive_doubling
from tp_from_scratch.testing import random_array, rank_rng


def _max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) if np.size(a) else 0.0


def row_parallel_bits(ts=(1, 2, 4, 8), rows=64, k=512, n=384, seed=0, n_leaves=tree.DEFAULT_LEAVES):
    """{t: {"plain equal", "plain diff", "tree equal", "tree diff"}} for Y = X W, float32.

    plain: each rank x_r @ w_r (BLAS), then Lesson 2's ring all-reduce, against X @ W on one
    device. tree: tree.invariant_row_parallel_matmul, against its own t = 1 result; its diff is
    against X @ W.
    """
    x = random_array(rank_rng(seed, 0), (rows, k), np.float32)
    w = random_array(rank_rng(seed, 1), (k, n), np.float32)
    one_device = x @ w

    def plain(comm):
        cols = np.array_split(np.arange(k), comm.world_size)[comm.rank]
        return collectives.all_reduce(comm, x[:, cols] @ w[cols])

    def fixed_tree(comm):
        cols = np.array_split(np.arange(k), comm.world_size)[comm.rank]
        return tree.invariant_row_parallel_matmul(comm, x[:, cols], w[cols], n_leaves)

    tree_one = run_spmd(fixed_tree, 1)[0]
    table = {}
    for t in ts:
        p, q = run_spmd(plain, t)[0], run_spmd(fixed_tree, t)[0]
        table[t] = {"plain equal": bool(np.array_equal(p, one_device)), "plain diff": _max_diff(p, one_device),
                    "tree equal": bool(np.array_equal(q, tree_one)), "tree diff": _max_diff(q, one_device)}
    return table


def ring_chunk_orders(p=4, n=4096, seed=0):
    """[for each chunk c of the ring all-reduce on p ranks: the rank s whose value comes first when
    the chunk equals the sequential sum around the ring ((x_s + x_s+1) + ...) + x_s-1, bit for bit]."""
    xs = [random_array(rank_rng(seed, r), (n,), np.float32) for r in range(p)]
    ring = run_spmd(lambda comm: collectives.all_reduce(comm, xs[comm.rank]), p)[0]
    starts = []
    for c, idx in enumerate(np.array_split(np.arange(n), p)):
        found = None
        for s in range(p):
            total = xs[s][idx]
            for j in range(1, p):
                total = total + xs[(s + j) % p][idx]
            if np.array_equal(total, ring[idx]):
                found = s
                break
        starts.append(found)
    return starts


def matmul_slice_bits(rows=(1, 2, 4, 7, 8, 12, 16), columns=(1, 2, 4, 7, 8, 16, 32), shape=(96, 192, 256), seed=0):
    """{matmul: {"rows": {m: bool}, "columns": {n: bool}}}: is the product of the first m rows of X
    (n rows of W) the same bits as those rows (columns) of the whole X W^T? float32, (M, N, K) = shape."""
    M, N, K = shape
    gen = torch.Generator().manual_seed(seed)
    x, w = torch.randn(M, K, generator=gen), torch.randn(N, K, generator=gen)
    table = {}
    for name, matmul in (("F.linear", F.linear), ("invariant_linear", invariant_linear)):
        full = matmul(x, w)
        table[name] = {"rows": {m: torch.equal(matmul(x[:m], w), full[:m]) for m in rows},
                       "columns": {c: torch.equal(matmul(x, w[:c]), full[:, :c]) for c in columns}}
    return table


def head_count_bits(ts=(2, 4, 8), batch=4, heads=8, seq=32, head_size=8, seed=0):
    """{t: bool}: attention's scores (q k^T, a bmm), softmax and att @ v on nh/t heads at a time,
    the same bits as on all nh heads at once? float32."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, seq, head_size, generator=gen) for _ in range(3))

    def attention(q, k, v):
        return (q @ k.transpose(-2, -1)).softmax(-1) @ v   # (B, n, T, hs)
    full = attention(q, k, v)
    table = {}
    for t in ts:
        n = heads // t
        table[t] = all(torch.equal(attention(q[:, i:i + n], k[:, i:i + n], v[:, i:i + n]), full[:, i:i + n])
                       for i in range(0, heads, n))
    return table


ELEMENTWISE = {"exp": torch.exp, "GELU (erf)": F.gelu, "GELU (tanh)": lambda x: F.gelu(x, approximate="tanh"),
               "SiLU": F.silu}


def elementwise_step():
    """Float32 elements per iteration of ATen's vectorized element-wise loop on this CPU: two
    vectors (aten/src/ATen/native/cpu/Loops.h, vectorized_loop steps 2 * Vec::size(); the
    elements past the last whole step go through a scalar loop): 32 with AVX512, 16 with AVX2."""
    return 32 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 16


def elementwise_tail_bits(lengths=range(1, 129), seeds=range(8)):
    """{kernel: [lengths L at which f(x[:L]) differs from f(x)[:L] for some x]}: float32, x of 4096
    gaussian numbers drawn from each seed (an element whose two paths happen to round alike hides
    the difference, so one draw is not enough)."""
    xs = [torch.randn(4096, generator=torch.Generator().manual_seed(seed)) for seed in seeds]
    return {name: [n for n in lengths if any(not torch.equal(fn(x[:n].clone()), fn(x)[:n]) for x in xs)]
            for name, fn in ELEMENTWISE.items()}


# ---------------------------------------------------------------------------------------
# What breaks the tree: the same leaves, another order
# ---------------------------------------------------------------------------------------

def ring_reduce(comm, leaves, n_leaves=tree.DEFAULT_LEAVES):
    """WRONG for invariance: the rank's subtree, then Lesson 2's ring (its order depends on the rank)."""
    tree.check_shard(np.asarray(leaves), n_leaves, comm.world_size, comm.rank)
    return collectives.all_reduce(comm, tree.local_tree_sum(np.asarray(leaves)))


def sequential_reduce(comm, leaves, n_leaves=tree.DEFAULT_LEAVES):
    """WRONG for invariance: the rank's leaves added one after the other, then recursive doubling."""
    leaves = np.asarray(leaves)
    tree.check_shard(leaves, n_leaves, comm.world_size, comm.rank)
    total = leaves[0].copy()
    for leaf in leaves[1:]:
        total = total + leaf
    return all_reduce_recursive_doubling(comm, total)


REDUCTIONS = {"fixed tree": tree.tree_all_reduce, "ring instead": ring_reduce, "sequential in a rank": sequential_reduce}


def breaking_variants(ts=(1, 2, 4, 8), shape=(4096,), seed=0, n_leaves=tree.DEFAULT_LEAVES):
    """{reduction: {t: bool}}: the sum of the same n_leaves float32 leaves, equal to the fixed tree
    on one rank, bit for bit?"""
    leaves = np.stack([random_array(rank_rng(seed, j), shape, np.float32) for j in range(n_leaves)])
    want = tree.local_tree_sum(leaves)
    table = {}
    for name, reduce in REDUCTIONS.items():
        def rank(comm):
            here = n_leaves // comm.world_size
            return reduce(comm, leaves[comm.rank * here:(comm.rank + 1) * here], n_leaves)
        table[name] = {t: bool(np.array_equal(run_spmd(rank, t)[0], want)) for t in ts}
    return table


def one_row_shard_bits(vocab=8, tokens=64, hidden=64, seed=0):
    """{matmul: bool}: logits of a vocabulary split into one row per rank (t = V), computed row by
    row, the same bits as all V at once? F.linear (BLAS) against invariant_linear, float32."""
    gen = torch.Generator().manual_seed(seed)
    h, weight = torch.randn(tokens, hidden, generator=gen), torch.randn(vocab, hidden, generator=gen)
    return {name: torch.equal(torch.cat([matmul(h, weight[v:v + 1]) for v in range(vocab)], -1), matmul(h, weight))
            for name, matmul in (("F.linear", F.linear), ("invariant_linear", invariant_linear))}
