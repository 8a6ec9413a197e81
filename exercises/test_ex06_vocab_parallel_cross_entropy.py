"""Graders for Exercise 6: vocab-parallel cross-entropy.

Every test runs t simulated ranks (run_spmd), hands each rank its block of random logits,
and compares the loss and the rank's block of d loss / d logits with
torch.nn.functional.cross_entropy on the full logits, through the course's one comparison
helper. Logits of size 1000 catch a missing max subtraction (exp overflows); targets on the
block boundaries catch off-by-one masks; the meter catches gathering the full logits.
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
        loss = impl.vocab_parallel_cross_entropy(comm, local, target.clone(), ignore_index=ignore_index,
                                                 vocab_start=lo)
        (upstream * loss).backward()
        traffic = {name: (tr.calls, tr.bytes_sent) for name, tr in comm.meter.by_collective.items()}
        return loss.detach(), local.grad, local.detach(), before, traffic

    results = run_graded(on_rank, t)
    for rank, (loss, grad, after, before, _) in enumerate(results):
        lo = sum(sizes[:rank])
        assert_matches_reference(loss, loss_ref, name="loss", rank=rank)
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
@pytest.mark.parametrize("t", [1, 2, 4])
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
