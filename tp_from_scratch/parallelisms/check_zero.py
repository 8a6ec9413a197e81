"""ZeRO-1 and ZeRO-2 on any communicator, against unsharded AdamW after every step.

    .venv/bin/python -m tp_from_scratch.parallelisms.check_zero                         # simulated ranks, dp = 1..4
    .venv/bin/mpiexec -n 3 .venv/bin/python -m tp_from_scratch.parallelisms.check_zero  # MPI, from-scratch ring collectives
    .venv/bin/torchrun --standalone --nproc-per-node 3 -m tp_from_scratch.parallelisms.check_zero

Every rank trains a small model (58 parameters: uneven over 3 and 4 ranks) on its own random
rows with ZeroOptimizer over the communicator (the ring collectives of Lesson 2 on numpy
arrays); every rank also computes the single-device reference (AdamW on the mean loss over
all ranks' rows, which are a function of (step, rank)) and compares its parameters after
every step through tp_from_scratch.compare. Checks that the optimizer state adds up over
the ranks to unsharded AdamW's, and that ZeRO-2 keeps only its chunk's gradient.
"""
import torch

from tp_from_scratch.comm.launch import check_main
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.nn.mappings import all_gather
from tp_from_scratch.parallelisms.zero import ZeroOptimizer, chunk_bounds, optimizer_state_bytes
from tp_from_scratch.testing import random_array, rank_rng

STEPS = 3
LR = 1e-2


def small_model():
    """58 parameters (7*5 + 5 + 5*3 + 3), float64, the same on every rank (its own generator)."""
    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return model


def batch(rank, step):
    """Rank ``rank``'s rows at ``step``: inputs (4, 7) and targets (4, 3)."""
    rng = rank_rng(100 + step, rank)
    return torch.from_numpy(random_array(rng, (4, 7))), torch.from_numpy(random_array(rng, (4, 3)))


def adamw(params):
    return torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), weight_decay=0.1, foreach=False)


def reference(dp, steps=STEPS):
    """Unsharded AdamW on one device: (parameters after every step, the optimizer)."""
    model = small_model()
    opt = adamw(model.parameters())
    after = []
    for s in range(steps):
        opt.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(model(x), y) for x, y in (batch(r, s) for r in range(dp))) / dp
        loss.backward()
        opt.step()
        after.append([(name, p.detach().clone()) for name, p in model.named_parameters()])
    return after, opt


def zero_run(comm, stage, steps=STEPS, gradient_reduce="reduce_scatter"):
    """ZeRO on this rank: (parameters after every step, optimizer state bytes, gradient bytes kept).

    gradient_reduce: "reduce_scatter" (the paper's ZeRO) or "all_reduce" (the naive first ZeRO-1)."""
    model = small_model()
    opt = ZeroOptimizer(comm, model.parameters(), stage, adamw, gradient_reduce)
    after = []
    for s in range(steps):
        x, y = batch(comm.rank, s)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        after.append([p.detach().clone() for p in model.parameters()])
    return after, opt.state_bytes(), opt.gradient_bytes()


def report(comm):
    """Check ZeRO-1 and ZeRO-2 on ``comm`` against the reference; rank 0 prints one line each."""
    dp, r = comm.world_size, comm.rank
    expected, opt = reference(dp)
    whole = optimizer_state_bytes(opt)
    start, stop = chunk_bounds(58, dp, r)
    for stage, reduce in ((1, "all_reduce"), (1, "reduce_scatter"), (2, "reduce_scatter")):
        label = f"ZeRO-{stage}" + (" naive (all-reduce)" if reduce == "all_reduce" else "")
        after, state, grads = zero_run(comm, stage, gradient_reduce=reduce)
        for s, (got, want) in enumerate(zip(after, expected)):
            # weights after s + 1 AdamW steps: the policy's growth rule with AdamW's lr / eps
            bound = tolerance(torch.float64, layers=2, steps=s + 1, adamw_lr=LR)
            for p, (name, ref) in zip(got, want):
                assert_matches_reference(p, ref, name=f"{name} after step {s + 1} ({label}, dp={dp})", rank=r,
                                         tol=bound)
        states = all_gather(comm, torch.tensor([state]), dim=0).tolist()
        if sum(states) != whole or max(states) != 2 * 8 * -(-58 // dp):
            raise AssertionError(f"rank {r}: {label} optimizer state {states} adds up to {sum(states)} "
                                 f"bytes, unsharded AdamW holds {whole}; each should hold at most "
                                 f"2 x 8 x ceil(58/{dp})")
        kept = 8 * ((stop - start) + (58 if stage == 1 else 0))
        if grads != kept:
            raise AssertionError(f"rank {r}: {label} keeps {grads} bytes of gradients, expected {kept}")
        if r == 0:
            print(f"dp={dp} {label}: parameters equal to unsharded AdamW after each of {STEPS} steps; "
                  f"optimizer state per rank {states} bytes (unsharded {whole}); "
                  f"{type(comm).__name__}", flush=True)
    return True


def main():
    check_main(report)


if __name__ == "__main__":
    main()
