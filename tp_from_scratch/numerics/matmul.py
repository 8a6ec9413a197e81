"""Matmuls whose bits do not depend on how TP sliced their operands.

A BLAS matmul picks its kernel, its blocking and its order of accumulation from the shapes it
is handed. Slice the output's rows or columns (a column-parallel layer at t ranks computes
out/t columns) and an element may come out in other bits than the same element of the whole
product (Lesson 13 measures where: on this machine F.linear is not slice-invariant below 16
columns, nor at 1 or 2 rows, and at some other row counts with two threads). Two ways out, each used where it fits:

    invariant_linear(x, w)       F.linear(x, w) as a product then a sum over the contiguous
                                 last axis: every output element is its own reduction of K
                                 numbers, whatever the other rows and columns are. For a
                                 dimension t slices (column-parallel outputs, the weight
                                 gradients, a row-parallel dX).
    leaf_products(a, b, count)   one BLAS matmul per leaf of the reduced axis, each on a
                                 contiguous copy of the same shape at every t: for the partial
                                 sums of a reduction t splits (row-parallel forward, the
                                 column-parallel dX), which the fixed tree then adds.

The price of the first: it materialises (M, N, K) products in blocks and adds them without
BLAS's register blocking: many times slower than F.linear (numerics.bench measures it).
"""
import torch

BLOCK_ELEMENTS = 1 << 21  # the (rows, N, K) products held at once by invariant_linear


@torch.no_grad()
def invariant_linear(x, weight, bias=None):
    """F.linear(x, weight, bias), every element computed alone: sum_k x[m, k] * weight[n, k].

    x (..., K), weight (N, K), bias (N,) or None -> (..., N). The products of a block of rows
    are formed at once, (rows, N, K), then summed over their contiguous last axis: how many
    rows or columns there are changes no element's bits. Not differentiable (the layers use it
    in their own forward and backward).
    """
    K, N = x.shape[-1], weight.shape[0]
    flat = x.reshape(-1, K)                                  # (M, K)
    w = weight.contiguous()
    rows = max(1, BLOCK_ELEMENTS // max(1, N * K))
    out = torch.empty(flat.shape[0], N, dtype=torch.result_type(x, weight), device=x.device)
    for start in range(0, flat.shape[0], rows):
        block = flat[start:start + rows]
        out[start:start + rows] = (block[:, None, :] * w[None, :, :]).sum(-1)  # (rows, N)
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], N)


@torch.no_grad()
def leaf_products(a, b, count):
    """(count, M, m): a[:, leaf] @ b[leaf, :] for each of ``count`` equal leaves of the shared axis.

    a (..., n) flattened to (M, n), b (n, m). Each leaf is a contiguous copy, (M, n/count) @
    (n/count, m): the shapes do not depend on t, so neither does any leaf's product.
    """
    n = a.shape[-1]
    width = n // count
    flat = a.reshape(-1, n)                                  # (M, n)
    return torch.stack([flat[:, j * width:(j + 1) * width].contiguous() @ b[j * width:(j + 1) * width].contiguous()
                        for j in range(count)])
