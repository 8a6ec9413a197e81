"""Graders for Exercise 5b: vocab-parallel cross-entropy.

Every test runs t simulated ranks (run_spmd), hands each rank its block of random logits,
and compares the loss and the rank's block of d loss / d logits with
torch.nn.functional.cross_entropy on the full logits, through the course's one comparison
helper. Logits of size 1000 catch a missing max subtraction (exp overflows); targets on the
block boundaries catch off-by-one masks; the meter catches gathering the full logits.
The logits and the targets must be unchanged afterwards. A failure whose numbers carry the
signature of a common mistake (exp overflowing, ignored positions counted) adds a hint.
"""
import pytest
import torch
from torch.nn import functional as F

from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.tools.grading import run_graded
from tp_from_scratch.sharding import shard_sizes
from tp_from_scratch.testing import random_array, rank_rng

WORLD_SIZES = [1, 2, 3, 4]
B, T = 4, 8  # N = 32 tokens


def problem(seed, vocab, dtype, scale=3.0, ignore_index=-100):
    """Full logits (B, T, V) and targets (B, T): every block boundary is a target, some are ignored."""
    rng = rank_rng(seed, 0)
    logits = torch.tensor(scale * random_array(rng, (B, T, vocab)), dtype=dtype)
    target = torch.tensor(rng.integers(0, vocab, size=(B, T)))
    edges = sorted({0, vocab - 1, *(s for t in WORLD_SIZES for s in _starts(vocab, t))})
    target.view(-1)[:len(edges)] = torch.tensor(edges)        # the first and last id of every block
    target.view(-1)[len(edges):len(edges) + 5] = ignore_index  # a few ignored positions
    return logits, target


def _starts(vocab, t):
    sizes = shard_sizes(vocab, t)
    return [sum(sizes[:r]) for r in range(t)] + [sum(sizes[:r + 1]) - 1 for r in range(t)]


def loss_hint(loss, logits, target, ignore_index):
    """A targeted hint for a wrong loss: the tell-tale values of two common mistakes."""
    if not torch.isfinite(loss).all():
        return ("\nHint: the loss is inf or nan: exp overflowed. Subtract the max logit of each "
                "token (an all-reduce with op='max' over the ranks) before exp")
    flat, tgt = logits.reshape(-1, logits.shape[-1]).double(), target.reshape(-1)
    lse = torch.logsumexp(flat, -1)
    in_range = (tgt >= 0) & (tgt < flat.shape[-1])
    picked = flat.gather(-1, tgt.clamp(0, flat.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
    # every position counted, ignored ones included: an ignored id in the vocabulary picks its
    # logit; one outside it picks nothing (0), from the raw or the max-shifted logits
    shift = flat.max(-1).values
    candidates = [torch.where(in_range, lse - picked, lse - out).mean() for out in (0.0, shift)]
    if any(torch.allclose(loss.double(), c, rtol=1e-5, atol=1e-8) for c in candidates):
        return (f"\nHint: the loss counts the positions whose target is ignore_index={ignore_index}: "
                "leave them out of the sum and divide by the number of positions that count")
    return ""


def grade(impl, t, vocab, dtype, scale=3.0, ignore_index=-100, seed=70, upstream=2.5):
    """Run the learner's loss on t ranks; compare loss, gradient block and untouched input."""
    logits, target = problem(seed, vocab, dtype, scale, ignore_index)
    z = logits.clone().requires_grad_()
    loss_ref = F.cross_entropy(z.reshape(-1, vocab), target.reshape(-1), ignore_index=ignore_index)
    (upstream * loss_ref).backward()  # a non-unit upstream gradient must scale the result
    sizes = shard_sizes(vocab, t)

    def on_rank(comm):
        lo = sum(sizes[:comm.rank])
        local = logits[..., lo:lo + sizes[comm.rank]].clone().requires_grad_()  # (B, T, V_r)
        before = local.detach().clone()
        comm.meter.reset()
        given_target = target.clone()
        loss = impl.vocab_parallel_cross_entropy(comm, local, given_target, ignore_index=ignore_index,
                                                 vocab_start=lo)
        (upstream * loss).backward()
        assert torch.equal(given_target, target), f"rank {comm.rank}: the target tensor was modified in place"
        traffic = {name: (tr.calls, tr.bytes_sent) for name, tr in comm.meter.by_collective.items()}
        return loss.detach(), local.grad, local.detach(), before, traffic

    results = run_graded(on_rank, t)
    for rank, (loss, grad, after, before, _) in enumerate(results):
        lo = sum(sizes[:rank])
        try:
            assert_matches_reference(loss, loss_ref, name="loss", rank=rank)
        except AssertionError as error:
            raise AssertionError(f"{error}{loss_hint(loss, logits, target, ignore_index)}") from None
        assert_matches_reference(grad, z.grad[..., lo:lo + sizes[rank]], name="d loss / d local logits", rank=rank)
        assert_matches_reference(after, before, name="local logits (must not be modified)", rank=rank, exact=True)
    return results


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("t", WORLD_SIZES)
def test_loss_and_gradient_equal_F_cross_entropy(impl, t, dtype):
    grade(impl, t, 64, dtype)


@pytest.mark.parametrize("t", [2, 3, 4])
def test_a_vocabulary_that_t_does_not_divide(impl, t):
    grade(impl, t, 13, torch.float64)  # blocks of 7+6, 5+4+4, 4+3+3+3


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("t", [1, 3, 4])
def test_logits_of_size_1000_do_not_overflow(impl, t, dtype):
    # exp(1000) is inf in any float type: only the max subtraction keeps the loss finite
    grade(impl, t, 64, dtype, scale=1000.0)


@pytest.mark.parametrize("t", WORLD_SIZES)
def test_ignore_index_can_be_a_real_id(impl, t):
    grade(impl, t, 64, torch.float64, ignore_index=5)


@pytest.mark.parametrize("t", [2, 4])
def test_the_full_logits_are_never_gathered(impl, t):
    vocab = 64
    local_bytes = B * T * (vocab // t) * 8  # one rank's float64 logits
    for rank, (*_, traffic) in enumerate(grade(impl, t, vocab, torch.float64)):
        assert set(traffic) <= {"all_reduce"}, \
            f"rank {rank}: only all-reduces of per-token numbers are needed, got {traffic}"
        assert sum(calls for calls, _ in traffic.values()) <= 3, f"rank {rank}: more than 3 all-reduces: {traffic}"
        sent = sum(nbytes for _, nbytes in traffic.values())
        # three ring all-reduces of N float64 send < 3 * 2 * N * 8 bytes; the logits are far more
        assert sent < local_bytes, f"rank {rank} sent {sent} bytes, as much as its {local_bytes} bytes of logits"
