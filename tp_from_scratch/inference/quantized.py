"""Quantized all-reduce: the row-parallel partial sums travel in a few bits per number.

A row-parallel layer's output is Partial: rank r holds P_r and TP needs sum_r P_r (Lesson 3's g).
Two ways to send fewer bytes, both forward-only (inference), neither retrains the model:

    two_step_all_reduce     Flash Communication (Li et al., arXiv 2412.04964): the tensor is cut
                            into t chunks; every rank quantizes its P_r and sends chunk j to rank j
                            (an all-to-all, the reduce-scatter's messages), rank j dequantizes the
                            t pieces and sums them in its own precision, re-quantizes its sum and
                            all-gathers it; every rank dequantizes every chunk.
                            Single device: out_j = QDQ(sum_r QDQ(P_r[j])) for every chunk j.
    all_gather_all_reduce   Compress-then-gather (as the notes read Hansen-Palmus et al., arXiv
                            2411.09510): every rank quantizes P_r and all-gathers it; every rank
                            dequantizes the t partials and sums them.  out = sum_r QDQ(P_r).

QDQ (quantize, then dequantize) is per group of ``group_size`` consecutive numbers of the
flattened tensor, asymmetric min-max: lo = min, scale = (max - min) / (2^bits - 1),
code = round((x - lo) / scale) clamped to 0 .. 2^bits - 1 (round half to even), x^ = lo + code
scale. The codes are packed ``bits`` to a number into bytes, and each group sends its lo and
scale in the tensor's dtype; chunks are whole groups, so both schemes group a rank's partial the
same way. The paper's own group sizes and scale format were not read here (notes §3b: a
third-party reading says asymmetric, group 128); vLLM's QuickReduce uses symmetric INT4 groups of
32 (vllm-project/vllm#19744). bits = 16 means no quantization: the plain ring all-reduce of
Lesson 2, the model's own 16-bit activations as they are. At t = 1 nothing travels and nothing
is quantized.

Errors enter twice in the two-step scheme (each partial, then each chunk's sum) and t times,
once per partial, in the all-gather scheme. Bytes per rank (payload(n) = ceil(n bits / 8) + 2
groups(n) itemsize): two-step sum_{j != r} payload(chunk j) + sum_{j != r+1} payload(chunk j),
about 2 (t-1)/t of the tensor's payload like a ring all-reduce; all-gather (t-1) payload(N).
"""
import math

import numpy as np
import torch

from tp_from_scratch.collectives import ring_all_reduce_bytes, ring_messages
from tp_from_scratch.nn.collectives import all_gather, all_reduce, all_to_all_v, tp_rank, tp_world_size

UNQUANTIZED = 16  # bits: the activations travel as they are (a plain all-reduce)
SCHEMES = ("two_step", "all_gather")


def check_quantization(bits, group_size, scheme="two_step"):
    """A ValueError naming bits (1..8, or 16: none), group_size (>= 1) or the scheme."""
    if not isinstance(bits, (int, np.integer)) or isinstance(bits, bool) or bits not in (*range(1, 9), UNQUANTIZED):
        raise ValueError(f"bits must be 1..8 (quantized) or {UNQUANTIZED} (not quantized), got {bits!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
        raise ValueError(f"group_size must be a whole number >= 1, got {group_size!r}")
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {list(SCHEMES)}, got {scheme!r}")


# ---------------------------------------------------------------------------------------
# Quantize, dequantize, pack
# ---------------------------------------------------------------------------------------

def _grouped(x, group_size):
    """x (n,) -> (groups, group_size): the tail group padded with its own last value, which
    changes neither its minimum nor its maximum."""
    n = x.numel()
    pad = -n % group_size
    if pad:
        x = torch.cat([x, x[-1:].expand(pad)])
    return x.view(-1, group_size)


def quantize(x, bits, group_size):
    """x (n,) float -> (codes (n,) uint8 in 0 .. 2^bits - 1, lo (groups,), scale (groups,)).

    Per group of group_size consecutive numbers: lo = min, scale = (max - min) / (2^bits - 1),
    code = clamp(round((x - lo) / scale)) in x's dtype, round half to even (torch.round). A
    constant group has scale 0 and codes 0. Finite inputs only.
    """
    n, levels = x.numel(), 2 ** bits - 1
    if n == 0:
        return torch.zeros(0, dtype=torch.uint8), x.new_zeros(0), x.new_zeros(0)
    g = _grouped(x, group_size)                                               # (G, g)
    lo, hi = g.min(dim=1).values, g.max(dim=1).values                         # (G,)
    scale = (hi - lo) / levels
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.round((g - lo[:, None]) / safe[:, None]).clamp_(0, levels)
    codes = torch.where(scale[:, None] > 0, codes, torch.zeros_like(codes))
    return codes.reshape(-1)[:n].to(torch.uint8), lo, scale


def dequantize(codes, lo, scale, group_size):
    """codes (n,), lo and scale (groups,) -> x^ (n,) = lo + code scale, in lo's dtype."""
    n = codes.numel()
    if n == 0:
        return lo.new_zeros(0)
    g = _grouped(codes.to(lo.dtype), group_size)                              # (G, g)
    return (lo[:, None] + g * scale[:, None]).reshape(-1)[:n]


def quantize_dequantize(x, bits, group_size):
    """QDQ(x): what arrives when x (any shape) is sent in ``bits`` per number, groups of
    ``group_size`` along the flattened tensor; x itself at bits = 16."""
    if bits == UNQUANTIZED:
        return x.clone()
    flat = x.reshape(-1)
    return dequantize(*quantize(flat, bits, group_size), group_size).view_as(x)


def pack_codes(codes, bits):
    """codes (n,) uint8 < 2^bits -> ceil(n bits / 8) bytes (uint8): bit i of code j at bit
    position j bits + i of the stream, least significant first."""
    c = codes.numpy().astype(np.uint8)
    stream = np.unpackbits(c[:, None], axis=1, bitorder="little")[:, :bits]   # (n, bits)
    return torch.from_numpy(np.packbits(stream.reshape(-1), bitorder="little"))


def unpack_codes(packed, bits, n):
    """The inverse of pack_codes: n codes (uint8) from the first ceil(n bits / 8) bytes."""
    stream = np.unpackbits(packed.numpy().astype(np.uint8), bitorder="little")[:n * bits]
    c = np.packbits(stream.reshape(n, bits), axis=1, bitorder="little")[:, 0] if n else np.zeros(0, np.uint8)
    return torch.from_numpy(np.ascontiguousarray(c))


def groups_of(n, group_size):
    return math.ceil(n / group_size)


def payload_bytes(n, bits, group_size, itemsize):
    """Bytes of n numbers sent quantized: the packed codes plus each group's lo and scale."""
    return math.ceil(n * bits / 8) + 2 * groups_of(n, group_size) * itemsize


def encode(x, bits, group_size):
    """x (n,) -> one uint8 message: packed codes, then lo and scale as raw bytes of x's dtype."""
    codes, lo, scale = quantize(x, bits, group_size)
    meta = torch.cat([lo, scale]).contiguous().view(torch.uint8)
    return torch.cat([pack_codes(codes, bits), meta])


def decode(message, n, bits, group_size, dtype):
    """The inverse of encode, dequantized: (n,) of ``dtype``."""
    if n == 0:
        return torch.zeros(0, dtype=dtype)
    codes_end = math.ceil(n * bits / 8)
    meta = message[codes_end:].clone().view(dtype)  # a copy: a view of bytes must start aligned
    G = groups_of(n, group_size)
    return dequantize(unpack_codes(message[:codes_end], bits, n), meta[:G], meta[G:], group_size)


# ---------------------------------------------------------------------------------------
# Chunks of whole groups
# ---------------------------------------------------------------------------------------

def chunk_bounds(n, group_size, t):
    """[(start, stop)] of t chunks of the n numbers, each a run of whole groups (the groups
    split like numpy.array_split: the first ones get one more); a chunk may be empty."""
    bounds, start = [], 0
    for count in np.array_split(np.arange(groups_of(n, group_size)), t):
        stop = min(n, start + len(count) * group_size)
        bounds.append((start, stop))
        start = stop
    return bounds


# ---------------------------------------------------------------------------------------
# The collectives (forward only), on a ProcessGroup or a Comm
# ---------------------------------------------------------------------------------------

def two_step_all_reduce(group, x, bits, group_size):
    """sum over ranks of x, quantized twice (Flash Communication's two-step all-reduce): a new
    tensor, the same on every rank. One all-to-all of uint8 messages (each rank's chunk j to rank
    j), a sum in x's dtype in rank order, one all-gather of the re-quantized chunks.
    Single device: QDQ(sum_r QDQ(P_r[j])) per chunk j (``two_step_reference``)."""
    check_quantization(bits, group_size)
    t, rank = tp_world_size(group), tp_rank(group)
    if bits == UNQUANTIZED:
        return all_reduce(group, x)
    if t == 1:
        return x.clone()
    flat = x.detach().reshape(-1)
    bounds = chunk_bounds(flat.numel(), group_size, t)
    sizes = [payload_bytes(b - a, bits, group_size, x.element_size()) for a, b in bounds]
    sent = torch.cat([encode(flat[a:b], bits, group_size) for a, b in bounds])
    a, b = bounds[rank]
    mine = all_to_all_v(group, sent, sizes, [sizes[rank]] * t).split([sizes[rank]] * t)  # t messages of chunk r
    total = decode(mine[0], b - a, bits, group_size, x.dtype)
    for message in mine[1:]:                     # rank order, as the reference sums
        total = total + decode(message, b - a, bits, group_size, x.dtype)
    chunks = all_gather(group, encode(total, bits, group_size), dim=0, sizes=sizes).split(sizes)
    out = [decode(c, hi - lo, bits, group_size, x.dtype) for c, (lo, hi) in zip(chunks, bounds)]
    return torch.cat(out).view_as(x)


def all_gather_all_reduce(group, x, bits, group_size):
    """sum over ranks of x, each partial quantized once: every rank all-gathers the t quantized
    partials and sums them, dequantized, in rank order. A new tensor, the same on every rank.
    Single device: sum_r QDQ(P_r) (``all_gather_reference``)."""
    check_quantization(bits, group_size)
    t = tp_world_size(group)
    if bits == UNQUANTIZED:
        return all_reduce(group, x)
    if t == 1:
        return x.clone()
    flat = x.detach().reshape(-1)
    n = flat.numel()
    size = payload_bytes(n, bits, group_size, x.element_size())
    every = all_gather(group, encode(flat, bits, group_size), dim=0).split([size] * t)
    total = decode(every[0], n, bits, group_size, x.dtype)
    for message in every[1:]:
        total = total + decode(message, n, bits, group_size, x.dtype)
    return total.view_as(x)


def quantized_all_reduce(group, x, bits, group_size, scheme="two_step"):
    """The sum over ranks of x by ``scheme``: two_step_all_reduce or all_gather_all_reduce."""
    check_quantization(bits, group_size, scheme)
    reduce = two_step_all_reduce if scheme == "two_step" else all_gather_all_reduce
    return reduce(group, x, bits, group_size)


# ---------------------------------------------------------------------------------------
# The single-device emulations: the t partials held by one process
# ---------------------------------------------------------------------------------------

def two_step_reference(partials, bits, group_size):
    """What two_step_all_reduce returns, from the list of every rank's partial (rank order)."""
    check_quantization(bits, group_size)
    t = len(partials)
    if bits == UNQUANTIZED or t == 1:
        return sum(partials[1:], partials[0].clone())
    flats = [p.reshape(-1) for p in partials]
    out = []
    for a, b in chunk_bounds(flats[0].numel(), group_size, t):
        total = quantize_dequantize(flats[0][a:b], bits, group_size)
        for f in flats[1:]:
            total = total + quantize_dequantize(f[a:b], bits, group_size)
        out.append(quantize_dequantize(total, bits, group_size))
    return torch.cat(out).view_as(partials[0])


def all_gather_reference(partials, bits, group_size):
    """What all_gather_all_reduce returns, from the list of every rank's partial (rank order)."""
    check_quantization(bits, group_size)
    if bits == UNQUANTIZED or len(partials) == 1:
        return sum(partials[1:], partials[0].clone())
    total = quantize_dequantize(partials[0], bits, group_size)
    for p in partials[1:]:
        total = total + quantize_dequantize(p, bits, group_size)
    return total


def reference_reduce(bits=UNQUANTIZED, group_size=128, scheme="two_step"):
    """partials -> their sum as ``quantized_all_reduce`` computes it on t ranks (the emulation)."""
    check_quantization(bits, group_size, scheme)
    reference = two_step_reference if scheme == "two_step" else all_gather_reference
    return lambda partials: reference(partials, bits, group_size)


# ---------------------------------------------------------------------------------------
# Bytes and messages per call, per rank (what the meter counts on a Comm)
# ---------------------------------------------------------------------------------------

def reduce_bytes(n, t, rank, bits, group_size, itemsize, scheme="two_step"):
    """Bytes rank ``rank`` sends in one quantized_all_reduce of n numbers of ``itemsize`` bytes."""
    check_quantization(bits, group_size, scheme)
    if t == 1:
        return 0
    if bits == UNQUANTIZED:
        return ring_all_reduce_bytes(n, itemsize, t, rank)
    if scheme == "all_gather":
        return (t - 1) * payload_bytes(n, bits, group_size, itemsize)
    sizes = [payload_bytes(b - a, bits, group_size, itemsize) for a, b in chunk_bounds(n, group_size, t)]
    # the all-to-all sends every chunk but this rank's own; the ring all-gather every chunk but rank r+1's
    return sum(sizes) - sizes[rank] + sum(sizes) - sizes[(rank + 1) % t]


def reduce_messages(t, bits, scheme="two_step"):
    """Messages one rank sends per call: 2(t-1) for the ring and the two-step, t-1 for all-gather."""
    if t == 1:
        return 0
    return t - 1 if scheme == "all_gather" and bits != UNQUANTIZED else ring_messages(t)
