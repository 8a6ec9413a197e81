"""Lesson 13: the numerics of tensor parallelism. Bitwise the same at every t, gradient norms
that TP gets right, and the all-reduce whose backward doubles.

    tree.py           the fixed binary-tree reduction over L leaves on a Comm (numpy): the same
                      bits at every t that divides L; the invariant row-parallel matmul (Exercise 13)
    reduction.py      the same tree on torch tensors, on a Comm or a native ProcessGroup (isend/irecv)
    matmul.py         matmuls whose bits do not depend on how t sliced them: invariant_linear
                      (product then sum) and leaf_products (one BLAS call per leaf)
    layers.py         InvariantColumnParallelLinear, InvariantRowParallelLinear, invariant_lm_head,
                      INVARIANT_STYLES (plan style -> layer), check_invariant(config, t, leaves)
    cross_entropy.py  the vocab-parallel cross-entropy with its denominator summed over fixed leaves
    model.py          invariant_tp_gpt: Lesson 6's TP GPT built from these layers (numerics.train trains it)
    measure.py        what changes the bits on this machine: the lesson's measurements
    clip.py           gradient-norm clipping that counts every distinct piece once (and the two
                      wrong norms), placed by the sharding plan
    doubling.py       torch's differentiable all-reduce where Megatron's g belongs: the t-times gradient
    bench.py          the invariant path's time beside the default path's
    check.py          the claims, on simulated ranks, under mpiexec or under torchrun
    train.py          Lesson 6's trainer on the invariant GPT: the same losses at every t
"""
from tp_from_scratch.numerics.cross_entropy import invariant_vocab_parallel_cross_entropy
from tp_from_scratch.numerics.layers import (INVARIANT_STYLES, InvariantColumnParallelLinear,
                                             InvariantRowParallelLinear, check_invariant, invariant_lm_head)
from tp_from_scratch.numerics.matmul import invariant_linear, leaf_products
from tp_from_scratch.numerics.reduction import tree_all_reduce
from tp_from_scratch.numerics.tree import DEFAULT_LEAVES, check_leaves, invariant_row_parallel_matmul, local_tree_sum

__all__ = ["DEFAULT_LEAVES", "check_leaves", "local_tree_sum", "tree_all_reduce", "invariant_row_parallel_matmul",
           "invariant_linear", "leaf_products", "InvariantColumnParallelLinear", "InvariantRowParallelLinear",
           "invariant_lm_head", "invariant_vocab_parallel_cross_entropy", "INVARIANT_STYLES", "check_invariant"]
