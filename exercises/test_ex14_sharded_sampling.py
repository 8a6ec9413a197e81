"""Graders for Exercise 14: the next token from the vocabulary shards.

Every test runs t simulated ranks (run_graded) on logits whose vocabulary is split unevenly, as
Lesson 5 splits it, and compares the ids every rank returns with the single-device reference
on the gathered logits (torch.argmax for greedy, the library's sample_gathered for sampling):
they must be IDENTICAL, ties included. The meter checks that only candidates travel.
"""
import math

import pytest
import torch

from tp_from_scratch.inference.sampling import sample_gathered, sharded_sampling_bytes
from tp_from_scratch.sharding import shard_sizes
from tp_from_scratch.testing import rank_rng
from tp_from_scratch.tools.grading import assert_not_aliased, collective_calls, run_graded

B, V = 6, 23


def logits_with_ties(vocab=V, dtype=torch.float32, seed=149, shift=0.0):
    """Random (B, V) logits with ties planted: row 0 its maximum at the first and the last id
    (two ranks), row 1 twice side by side, row 2 +inf twice, row 3 all -inf, row 4 its first
    half -inf, row 5 three ids tied high (where the k-th largest sits for small k)."""
    x = torch.tensor(rank_rng(seed).standard_normal((B, vocab))) + shift
    x[0, 0] = x[0, -1] = x[0].max() + 1
    x[1, vocab // 2] = x[1, vocab // 2 + 1] = x[1].max() + 1
    x[2, 1] = x[2, vocab - 2] = math.inf
    x[3] = -math.inf
    x[4, : vocab // 2] = -math.inf
    x[5, [0, vocab // 2, vocab - 1]] = x[5].max() + 0.5
    return x.to(dtype)


def shard(logits, t, rank):
    sizes = shard_sizes(logits.shape[1], t)
    start = sum(sizes[:rank])
    return logits[:, start:start + sizes[rank]].clone(), start


def on_ranks(impl, logits, t, how):
    """Every rank's (ids, bytes sent, collective calls, local logits before and after)."""
    def on_rank(comm):
        local, start = shard(logits, t, comm.rank)
        before = local.clone()
        comm.meter.reset()
        ids = how(impl, comm, local, start)
        return ids, comm.meter.bytes_sent, collective_calls(comm), before, local

    return run_graded(on_rank, t)


def check(results, expected, what, top_k=0):
    for rank, (ids, sent, calls, before, after) in enumerate(results):
        assert torch.is_tensor(ids) and ids.dtype == torch.int64 and ids.shape == expected.shape, \
            f"rank {rank}, {what}: expected a ({len(expected)},) int64 tensor, got {ids!r}"
        assert torch.equal(ids, expected), \
            f"rank {rank}, {what}: ids {ids.tolist()}, the gathered logits give {expected.tolist()}"
        t = len(results)
        most = sharded_sampling_bytes(len(expected), t, top_k)
        assert sent <= most, (f"rank {rank}, {what}: sent {sent} bytes; candidates cost at most {most} "
                              f"((t-1) B 16, + (t-1) B k 4 for top-k): are the logits gathered?")
        assert sum(calls.values()) <= (2 if top_k else 1), f"rank {rank}, {what}: collectives {calls}"
        assert torch.equal(before, after), f"rank {rank}, {what}: local_logits changed"


def greedy(impl, comm, local, start):
    return impl.greedy_from_shards(comm, local, start)


def sampler(temperature, top_k, seed=3, position=17):
    def how(impl, comm, local, start):
        return impl.sample_from_shards(comm, local, start, seed, position, temperature, top_k)
    how.expected = lambda logits: sample_gathered(logits, seed, position, temperature, top_k)
    return how


WORLD_SIZES = [1, 2, 3, 4, 8]


@pytest.mark.parametrize("t", WORLD_SIZES)
def test_greedy_is_the_gathered_argmax(impl, t):
    logits = logits_with_ties()
    check(on_ranks(impl, logits, t, greedy), logits.argmax(dim=-1), f"greedy at t={t}")


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
@pytest.mark.parametrize("t", WORLD_SIZES)
def test_temperature_sampling_is_the_gathered_sample(impl, t, temperature):
    logits = logits_with_ties()
    how = sampler(temperature, 0)
    check(on_ranks(impl, logits, t, how), how.expected(logits), f"temperature {temperature} at t={t}")


@pytest.mark.parametrize("top_k", [1, 3, 23, 40])
@pytest.mark.parametrize("t", WORLD_SIZES)
def test_top_k_sampling_keeps_the_ties_at_the_kth_score(impl, t, top_k):
    # row 5's three tied ids sit at the 1st..3rd place: k = 1 keeps all three (scores equal to the
    # k-th are kept); k = 40 > V keeps everything
    logits = logits_with_ties()
    how = sampler(0.8, top_k)
    check(on_ranks(impl, logits, t, how), how.expected(logits), f"top-{top_k} at t={t}", top_k)


def test_draws_follow_the_position_and_the_seed(impl):
    # a new position (the next token) or seed draws new numbers: the same as the reference's
    logits = torch.zeros(64, 10)  # flat: every id equally likely, so the draws decide alone
    for seed, position in [(0, 0), (0, 1), (1, 0)]:
        how = sampler(1.0, 0, seed, position)
        check(on_ranks(impl, logits, 2, how), how.expected(logits), f"seed {seed}, position {position}")


def test_ranks_without_ids_never_win(impl):
    # V = 5 on 8 ranks: ranks 5, 6 and 7 hold no ids; every finite logit is negative
    logits = logits_with_ties(vocab=5, shift=-10.0)
    check(on_ranks(impl, logits, 8, greedy), logits.argmax(dim=-1), "greedy, V=5 at t=8")
    for top_k in (0, 2):
        how = sampler(1.0, top_k)
        check(on_ranks(impl, logits, 8, how), how.expected(logits), f"top-{top_k}, V=5 at t=8", top_k)


def test_huge_logits_and_infinities(impl):
    # float32 logits near the largest float32, divided by 0.5: +inf, tied; -3e38 / 0.5: -inf
    logits = logits_with_ties()
    logits[0, 4] = logits[0, 9] = 3e38
    logits[1, :] = -3e38
    how = sampler(0.5, 0)
    check(on_ranks(impl, logits, 3, how), how.expected(logits), "huge logits at temperature 0.5")
    check(on_ranks(impl, logits, 3, greedy), logits.argmax(dim=-1), "greedy on huge logits")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_every_logit_dtype(impl, dtype):
    logits = logits_with_ties(dtype=dtype)
    check(on_ranks(impl, logits, 4, greedy), logits.argmax(dim=-1), f"greedy on {dtype}")
    how = sampler(0.7, 3)
    check(on_ranks(impl, logits, 4, how), how.expected(logits), f"top-3 on {dtype}", 3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_ids_above_what_the_logits_dtype_counts_exactly(impl, dtype):
    # bfloat16 holds every whole number only up to 256, float16 up to 2048; a real vocabulary
    # (Llama 3: 128256 ids) goes far beyond: an id must never travel in the logits' dtype
    vocab = 4099
    logits = logits_with_ties(vocab=vocab, dtype=dtype)
    logits[2, 1] = logits[2, vocab - 2] = 0.0          # row 2: no +inf, so its winner is an id
    for row, winner in enumerate([vocab - 1, 2049, 4097, 257, 3001, 1029]):
        if row != 3:                                   # row 3 stays all -inf (its id is 0)
            logits[row, winner] = 30.0                 # a unique maximum at an id the dtype rounds
    logits[0, 0] = 0.0
    check(on_ranks(impl, logits, 3, greedy), logits.argmax(dim=-1), f"greedy on {dtype}, V={vocab}")
    how = sampler(1.0, 2)
    check(on_ranks(impl, logits, 3, how), how.expected(logits), f"top-2 on {dtype}, V={vocab}", 2)


def test_results_are_new_tensors(impl):
    logits = logits_with_ties()

    def on_rank(comm):
        local, start = shard(logits, comm.world_size, comm.rank)
        for ids in (impl.greedy_from_shards(comm, local, start), impl.sample_from_shards(comm, local, start, 0, 0)):
            assert_not_aliased(ids, [local], "the ids", comm.rank)

    for t in (1, 2):
        run_graded(on_rank, t)


@pytest.mark.parametrize("temperature, top_k, needle", [(0.0, 0, "temperature"), (-1.0, 0, "temperature"),
                                                        (math.nan, 0, "temperature"), (math.inf, 0, "temperature"),
                                                        (1.0, -1, "top_k"), (1.0, 2.5, "top_k")])
def test_bad_settings_raise_a_value_error(impl, temperature, top_k, needle):
    logits = logits_with_ties()

    def on_rank(comm):
        local, start = shard(logits, 2, comm.rank)
        with pytest.raises(ValueError, match=needle):
            impl.sample_from_shards(comm, local, start, 0, 0, temperature, top_k)
        assert not comm.meter.messages_sent, f"rank {comm.rank} sent a message before raising"

    run_graded(on_rank, 2)


@pytest.mark.parametrize("which", ["greedy", "sample"])
def test_bad_shards_raise_a_value_error(impl, which):
    def call(comm, local, start):
        if which == "greedy":
            return impl.greedy_from_shards(comm, local, start)
        return impl.sample_from_shards(comm, local, start, 0, 0)

    def on_rank(comm):
        for local, start, needle in [(torch.zeros(5), 0, "local_logits"), (torch.zeros(2, 5, dtype=torch.long), 0,
                                     "local_logits"), (torch.zeros(2, 5), -1, "vocab_start"),
                                     (torch.zeros(2, 5), 1.5, "vocab_start")]:
            with pytest.raises(ValueError, match=needle):
                call(comm, local, start)
        assert not comm.meter.messages_sent, f"rank {comm.rank} sent a message before raising"

    run_graded(on_rank, 2)


def test_nan_on_one_rank_raises_on_every_rank(impl):
    logits = logits_with_ties()

    def on_rank(comm):
        local, start = shard(logits, 3, comm.rank)
        if comm.rank == 2:
            local[1, 0] = math.nan
        raised = []
        for call in (lambda: impl.greedy_from_shards(comm, local, start),
                     lambda: impl.sample_from_shards(comm, local, start, 0, 0, 1.0, 2)):
            try:
                call()
                raised.append(False)
            except ValueError:
                raised.append(True)
        return raised

    for rank, raised in enumerate(run_graded(on_rank, 3)):
        assert all(raised), f"rank {rank}: a NaN on rank 2 must raise a ValueError on every rank (greedy, top-k)"
