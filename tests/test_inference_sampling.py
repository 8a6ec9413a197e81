"""Lesson 14: choosing the next token from the vocabulary shards gives the SAME ids as choosing
it from the gathered logits, at every t, and sends the bytes the formula says.

The gathered reference is sample_gathered (Gumbel-max on gpt.generate's sampling_scores) and
torch.argmax for greedy. Every case below runs on simulated ranks with the vocabulary split
unevenly (V = 23), including t = 8, where some ranks hold two ids, and V = 5 at t = 8, where
three ranks hold none. The logits carry planted ties: equal maxima on two ranks, on one rank,
at the k-th largest score across ranks, +inf entries, whole -inf rows and shards.
"""
import math

import pytest
import torch

from tp_from_scratch.comm import SPMDError, run_spmd
from tp_from_scratch.inference.sampling import (gathered_sampling_bytes, greedy_from_shards, gumbel_noise,
                                                sample_from_shards, sample_gathered, sharded_sampling_bytes)
from tp_from_scratch.nn import gather_from_tp_region
from tp_from_scratch.sharding import shard_sizes
from tp_from_scratch.testing import rank_rng

B = 6


def planted_logits(vocab, dtype=torch.float32, seed=140):
    """(B, V) random logits with ties planted on purpose, rows:
    0 the maximum at the first and the last id (different ranks at t > 1); 1 the maximum twice
    side by side; 2 +inf twice; 3 every entry -inf; 4 the first half -inf; 5 three ids tied at
    one value high enough to sit at the k-th largest place for small k."""
    x = torch.tensor(rank_rng(seed).standard_normal((B, vocab)))
    x[0, 0] = x[0, -1] = x[0].max() + 1
    x[1, vocab // 2] = x[1, vocab // 2 + 1] = x[1].max() + 1
    x[2, 1] = x[2, vocab - 2] = math.inf
    x[3] = -math.inf
    x[4, : vocab // 2] = -math.inf
    x[5, [0, vocab // 2, vocab - 1]] = x[5].max() + 0.5
    return x.to(dtype)


CASES = [("greedy", None), ("sample", dict(temperature=1.0, top_k=0)), ("sample", dict(temperature=0.6, top_k=0)),
         ("sample", dict(temperature=1.7, top_k=1)), ("sample", dict(temperature=1.0, top_k=3)),
         ("sample", dict(temperature=0.8, top_k=40))]


def shard_of(logits, t, rank):
    """(rank's (B, V_r) logits, a copy; its first id): the vocabulary split as Lesson 5 splits it."""
    sizes = shard_sizes(logits.shape[1], t)
    start = sum(sizes[:rank])
    return logits[:, start:start + sizes[rank]].clone(), start


def choose_on_ranks(logits, t, seed=7, position=11):
    """On t simulated ranks: every case's ids and bytes sent, and the gathered version's bytes."""
    sizes = shard_sizes(logits.shape[1], t)

    def on_rank(comm):
        local, start = shard_of(logits, t, comm.rank)
        before = local.clone()
        out = []
        for kind, kw in CASES:
            comm.meter.reset()
            ids = (greedy_from_shards(comm, local, start) if kind == "greedy"
                   else sample_from_shards(comm, local, start, seed, position, **kw))
            out.append((ids, comm.meter.bytes_sent))
        comm.meter.reset()
        gathered = gather_from_tp_region(comm, local.contiguous(), sizes)     # gpt.generate's way
        return out, comm.meter.bytes_sent, torch.equal(local, before), torch.equal(gathered, logits)

    return run_spmd(on_rank, t)


def expected_ids(logits, seed=7, position=11):
    return [logits.argmax(dim=-1) if kind == "greedy" else sample_gathered(logits, seed, position, **kw)
            for kind, kw in CASES]


@pytest.mark.parametrize("t", [1, 2, 3, 4, 8])
def test_ids_from_shards_are_identical_to_gathered(t):
    logits = planted_logits(23)
    want = expected_ids(logits)
    for rank, (out, gathered_bytes, untouched, gathered_ok) in enumerate(choose_on_ranks(logits, t)):
        assert gathered_ok and untouched, f"rank {rank}: the shard changed, or the gathered logits are wrong"
        for (kind, kw), (ids, sent), expected in zip(CASES, out, want):
            assert ids.dtype == torch.int64 and torch.equal(ids, expected), \
                f"t={t} rank {rank} {kind} {kw}: ids {ids.tolist()}, gathered {expected.tolist()}"
            # the meter against the formula: (t-1) B 16 bytes, + (t-1) B k 4 for top-k
            top_k = kw["top_k"] if kw else 0
            assert sent == sharded_sampling_bytes(B, t, top_k), f"t={t} rank {rank} {kind} {kw}: sent {sent} bytes"
        assert gathered_bytes == gathered_sampling_bytes(B, 23, t, rank, 4), f"rank {rank}: gathered bytes"


def test_empty_shards_never_win():
    # V = 5 at t = 8: ranks 5, 6, 7 hold no ids; every row has negative maxima, so a shard that
    # sent (0, id 0) would win them
    logits = planted_logits(5) - 10
    want = expected_ids(logits)
    for rank, (out, *_) in enumerate(choose_on_ranks(logits, 8)):
        for (kind, kw), (ids, _), expected in zip(CASES, out, want):
            assert torch.equal(ids, expected), f"rank {rank} {kind} {kw}: {ids.tolist()} != {expected.tolist()}"


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_every_logit_dtype(dtype):
    logits = planted_logits(23, dtype)
    want = expected_ids(logits)
    for rank, (out, *_) in enumerate(choose_on_ranks(logits, 4)):
        for (kind, kw), (ids, _), expected in zip(CASES, out, want):
            assert torch.equal(ids, expected), f"{dtype} rank {rank} {kind} {kw}"


def test_huge_logits_overflow_alike():
    # float32 logits near the largest float32, divided by 0.5: inf on both sides, ties to the lowest id
    logits = planted_logits(23)
    logits[0, 4] = logits[0, 9] = 3e38
    logits[1, 7] = -3e38
    want = sample_gathered(logits, 3, 0, temperature=0.5)
    for rank, ids in enumerate(run_spmd(lambda c: sample_from_shards(c, *shard_of(logits, 2, c.rank), 3, 0,
                                                                     temperature=0.5), 2)):
        assert torch.equal(ids, want) and ids[0] == 4, f"rank {rank}: {ids.tolist()} != {want.tolist()}"


def test_noise_is_a_function_of_the_ids_alone():
    full = gumbel_noise(5, 9, 3, 0, 50)
    for start, count in [(0, 50), (17, 8), (49, 1), (50, 0)]:
        assert torch.equal(gumbel_noise(5, 9, 3, start, count), full[:, start:start + count])
    others = [gumbel_noise(6, 9, 3, 0, 50), gumbel_noise(5, 10, 3, 0, 50), gumbel_noise(5, 9, 4, 0, 50)[1:]]
    assert all(not torch.equal(o, full) for o in others[:2]) and not torch.equal(others[2], full[1:]), \
        "another seed, position or row must draw other numbers"
    assert torch.isfinite(full).all()


def test_gumbel_max_samples_the_softmax():
    # 40,000 rows with the same logits: the frequencies must be softmax(logits / T), as
    # torch.multinomial's; 6 standard deviations allow for the sampling error, a wrong
    # noise (uniform, or log u) misses by far more
    logits = torch.tensor([[1.0, 0.0, -1.0, 2.0, 0.5]]).expand(40_000, 5)
    ids = sample_gathered(logits, 1, 0, temperature=0.8)
    p = (logits[0] / 0.8).softmax(-1)
    freq = torch.bincount(ids, minlength=5).double() / len(ids)
    sigma = (p * (1 - p) / len(ids)).sqrt()
    assert ((freq - p).abs() <= 6 * sigma).all(), f"frequencies {freq.tolist()} against softmax {p.tolist()}"


@pytest.mark.parametrize("bad, needle", [(dict(temperature=0.0), "temperature"), (dict(temperature=-1.0), "temperature"),
                                         (dict(temperature=math.nan), "temperature"), (dict(top_k=-1), "top_k"),
                                         (dict(top_k=1.5), "top_k"), (dict(top_k=True), "top_k")])
def test_bad_arguments_are_named(bad, needle):
    logits = planted_logits(23)
    kw = dict(temperature=1.0, top_k=0) | bad
    with pytest.raises(ValueError, match=needle):
        sample_gathered(logits, 0, 0, **kw)
    with pytest.raises(SPMDError, match=needle):  # before any message: no rank waits for another
        run_spmd(lambda comm: sample_from_shards(comm, logits, 0, 0, 0, **kw), 2)


@pytest.mark.parametrize("logits, start, needle", [(torch.zeros(4), 0, "local_logits"),
                                                   (torch.zeros(2, 4, dtype=torch.long), 0, "local_logits"),
                                                   (torch.zeros(2, 4), -1, "vocab_start")])
def test_bad_shards_are_named(logits, start, needle):
    with pytest.raises(SPMDError, match=needle):
        run_spmd(lambda comm: greedy_from_shards(comm, logits, start), 2)


def test_nan_on_one_rank_stops_every_rank():
    logits = planted_logits(23)

    def on_rank(comm):
        local, start = shard_of(logits, 2, comm.rank)
        if comm.rank == 1:
            local[2, 3] = math.nan
        try:
            greedy_from_shards(comm, local, start)
        except ValueError as e:
            return str(e)
        return "no error"

    assert all("NaN" in message for message in run_spmd(on_rank, 2))


@pytest.mark.parametrize("t", [2, 3])
def test_generate_chooses_from_the_shards_with_the_ids_of_one_device(t):
    # gpt.generate's pick hook with shard_picker: the same sequences as one device (greedy also
    # as gpt.generate's own gathered argmax), and fewer bytes than gathering (B, V) every token
    from tp_from_scratch.gpt.generate import generate
    from tp_from_scratch.gpt.model import GPTConfig, init_gpt
    from tp_from_scratch.inference.models import tensor_parallel_gpt
    from tp_from_scratch.inference.sampling import shard_picker

    config = GPTConfig(arch="llama", vocab_size=53, seq_len=16, n_layers=2, hidden=24, n_heads=6, n_kv_heads=6, ffn=48)
    gpt = init_gpt(config, 151, torch.float64).eval()
    prompt = torch.randint(0, 53, (3, 4), generator=torch.Generator().manual_seed(152))
    settings = [dict(), dict(sample=True, seed=5, temperature=0.9, top_k=4), dict(sample=True, seed=6)]
    with torch.no_grad():
        single = [generate(gpt, prompt, 6, pick=shard_picker(**kw)) for kw in settings]
        assert torch.equal(single[0], generate(gpt, prompt, 6))

    def on_rank(comm):
        model = tensor_parallel_gpt(comm, gpt)
        out = []
        with torch.no_grad():
            for kw in settings:
                comm.meter.reset()
                ids = generate(model, prompt, 6, pick=shard_picker(**kw))
                out.append((ids, comm.meter.bytes_sent))
            comm.meter.reset()
            generate(model, prompt, 6)
        return out, comm.meter.bytes_sent

    for rank, (out, gathered) in enumerate(run_spmd(on_rank, t)):
        for kw, want, (ids, sent) in zip(settings, single, out):
            assert torch.equal(ids, want), f"t={t} rank {rank} {kw}: {ids.tolist()} != {want.tolist()}"
            assert sent < gathered, f"t={t} rank {rank} {kw}: {sent} bytes, gathering sends {gathered}"
