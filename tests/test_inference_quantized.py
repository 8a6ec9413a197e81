"""Lesson 14: the quantized all-reduces equal their single-device emulations bit for bit (float64,
the same QDQ arithmetic, the same order of sums) and send exactly the bytes of their formula.

QDQ itself is checked against an independent numpy version (np.rint, round half to even), and
the bit packing against its size and its inverse. Odd t (3, 5), group sizes that do not divide
the tensor, and tensors with fewer groups than ranks (empty chunks) are all in.
"""
import math

import numpy as np
import pytest
import torch

from tp_from_scratch.comm import SPMDError, run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.inference.quantized import (SCHEMES, chunk_bounds, pack_codes, quantize, quantize_dequantize,
                                                 quantized_all_reduce, reduce_bytes, reduce_messages, reference_reduce,
                                                 unpack_codes)
from tp_from_scratch.nn.collectives import all_reduce
from tp_from_scratch.testing import random_array, rank_rng


def partial(seed, rank, shape):
    return torch.tensor(random_array(rank_rng(seed, rank), shape) * 3)


@pytest.mark.parametrize("bits", range(1, 9))
def test_codes_pack_into_bits_and_back(bits):
    codes = torch.tensor(rank_rng(141, bits).integers(0, 2 ** bits, 37), dtype=torch.uint8)
    packed = pack_codes(codes, bits)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(37 * bits / 8)
    assert torch.equal(unpack_codes(packed, bits, 37), codes)


def numpy_qdq(x, bits, group_size):
    """QDQ written again with numpy, group by group: the independent reference."""
    out = np.empty_like(x)
    for a in range(0, len(x), group_size):
        g = x[a:a + group_size]
        lo, scale = g.min(), (g.max() - g.min()) / (2 ** bits - 1)
        codes = np.zeros_like(g) if scale == 0 else np.clip(np.rint((g - lo) / scale), 0, 2 ** bits - 1)
        out[a:a + group_size] = lo + codes * scale
    return out


@pytest.mark.parametrize("bits, group_size", [(2, 5), (4, 16), (6, 7), (8, 64), (3, 1)])
def test_qdq_against_numpy(bits, group_size):
    x = random_array(rank_rng(142, bits), 100)
    x[10:20] = 1.5  # a constant group (scale 0) for the small group sizes
    got = quantize_dequantize(torch.tensor(x), bits, group_size)
    assert_matches_reference(got, torch.tensor(numpy_qdq(x, bits, group_size)), name="QDQ", exact=True)
    # the error is at most half a step of its group (and 0 at group_size 1: min = max)
    codes, lo, scale = quantize(torch.tensor(x), bits, group_size)
    steps = scale.repeat_interleave(group_size)[:100]
    assert ((got - torch.tensor(x)).abs() <= steps / 2 + 1e-12).all()


def test_chunks_are_whole_groups():
    assert chunk_bounds(10, 4, 2) == [(0, 8), (8, 10)]           # 3 groups: 2 + 1
    assert chunk_bounds(10, 4, 4) == [(0, 4), (4, 8), (8, 10), (10, 10)]  # fewer groups than ranks
    assert chunk_bounds(0, 4, 3) == [(0, 0)] * 3


# (shape, group size, bits): groups that do not divide the tensor; a single group (empty chunks
# on every rank but the first); one number per group; 2 to 8 bits, and 16 (no quantization)
SETTINGS = [((2, 3, 10), 4, 4), ((1, 1, 7), 16, 6), ((4, 6), 1, 8), ((2, 1, 64), 32, 2), ((2, 3, 10), 4, 16)]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_quantized_all_reduce_equals_its_emulation(t, scheme):
    settings = SETTINGS

    def on_rank(comm):
        out = []
        for shape, g, bits in settings:
            x = partial(143, comm.rank, shape)
            before = x.clone()
            comm.meter.reset()
            y = quantized_all_reduce(comm, x, bits, g, scheme)
            out.append((y, comm.meter.bytes_sent, comm.meter.messages_sent, torch.equal(x, before),
                        y.data_ptr() != x.data_ptr()))
        return out

    for rank, results in enumerate(run_spmd(on_rank, t)):
        for (shape, g, bits), (y, sent, messages, untouched, fresh) in zip(settings, results):
            what = f"t={t} {scheme} {bits} bits, groups of {g}, {shape}, rank {rank}"
            expected = reference_reduce(bits, g, scheme)([partial(143, r, shape) for r in range(t)])
            # bits = 16 is the ring all-reduce, whose sums run in ring order: equal to roundoff
            assert_matches_reference(y, expected, name=what, exact=bits != 16)
            n = math.prod(shape)
            assert sent == reduce_bytes(n, t, rank, bits, g, 8, scheme), f"{what}: sent {sent} bytes"
            assert messages == reduce_messages(t, bits, scheme), f"{what}: {messages} messages"
            assert untouched and fresh, f"{what}: the input changed, or the output is the input"


def test_sixteen_bits_is_the_plain_all_reduce():
    def on_rank(comm):
        x = partial(144, comm.rank, (3, 8))
        return [quantized_all_reduce(comm, x, 16, 4, s) for s in SCHEMES], all_reduce(comm, x)

    for rank, (quantized, plain) in enumerate(run_spmd(on_rank, 3)):
        for y in quantized:
            assert_matches_reference(y, plain, name="16 bits against all_reduce", rank=rank, exact=True)


def test_fewer_bits_err_more_and_the_two_schemes_differ():
    # not a bound from a run: 2 bits must be worse than 8 (a quantizer that ignored bits passes
    # the emulation tests only if the emulation ignores them too), and the schemes are different functions
    parts = [partial(145, r, (4, 32)) for r in range(4)]
    exact = sum(parts)
    errors = {b: (reference_reduce(b, 8)(parts) - exact).abs().max() for b in (2, 4, 8)}
    assert errors[2] > errors[4] > errors[8] > 0
    assert not torch.equal(reference_reduce(4, 8, "two_step")(parts), reference_reduce(4, 8, "all_gather")(parts))


@pytest.mark.parametrize("bits, group_size, scheme, needle", [(0, 8, "two_step", "bits"), (9, 8, "two_step", "bits"),
                                                              (12, 8, "two_step", "bits"), (True, 8, "two_step", "bits"),
                                                              (4, 0, "two_step", "group_size"),
                                                              (4, 8, "ring", "scheme")])
def test_bad_settings_are_named(bits, group_size, scheme, needle):
    with pytest.raises(ValueError, match=needle):
        reference_reduce(bits, group_size, scheme)
    with pytest.raises(SPMDError, match=needle):
        run_spmd(lambda comm: quantized_all_reduce(comm, torch.zeros(4, dtype=torch.float64), bits, group_size,
                                                   scheme), 2)
