"""Lesson 11's checks: the pipeline, ZeRO and the whole mesh against one device, on any backend.

    .venv/bin/python -m tp_from_scratch.parallelisms.check pipeline                          # simulated, pp = 2, 3
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.parallelisms.check pipeline --tp 2
    .venv/bin/mpiexec -n 2 .venv/bin/python -m tp_from_scratch.parallelisms.check pipeline   # pp=2
    ... pipeline --model vit                                                                 # the ViT only
    .venv/bin/python -m tp_from_scratch.parallelisms.check zero                              # simulated, dp = 1..4
    .venv/bin/mpiexec -n 3 .venv/bin/python -m tp_from_scratch.parallelisms.check zero
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.parallelisms.check mesh \\
        --dp 2 --tp 2 --variant= --variant=--ddp --variant="--zero 1" --variant="--zero 2"

pipeline  For each model (the tiny GPT on token ids, then the tiny ViT on images), schedule
          (GPipe, 1F1B) and micro-batch count, a few AdamW steps in float64: every step's loss,
          every gradient (a TP rank's shard of it) and the parameters after the last step must
          match single-device training on the same global batches. Ranks are laid out as in
          mesh.py with dp = 1, TP innermost: rank = stage * tp + tp_rank.
zero      Every rank trains a small model (58 parameters: uneven over 3 and 4 ranks) on its own
          random rows with ZeroOptimizer over the communicator (Lesson 2's ring collectives on
          numpy arrays) and compares its parameters after every step with unsharded AdamW on the
          mean loss over all ranks' rows (a function of (step, rank)); the optimizer state adds
          up over the ranks to unsharded AdamW's, and ZeRO-2 keeps only its chunk's gradient.
mesh      For every --variant (extra trainer flags, which may change the mesh too: --variant="--pp
          2 --tp 2 --dp 1"), on the same processes, each on its own groups: a few steps of Lesson
          11's trainer; on rank 0, every step's loss equals the single-device loss, every
          variant's losses equal the first variant's (DDP's and ZeRO's equal the hand-written
          average's), and every rank's weights, gradients, optimizer bytes and bytes per step,
          by collective, group and point to point, equal the cost model's (parallelisms/cost.py).
          Prints one line per variant and exits 1 if anything differs.

A mismatch raises on that rank (assert_matches_reference) and ends the job.
"""
import argparse
import os
from functools import partial

import torch

from tp_from_scratch.comm.launch import torch_main
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.gpt import optim
from tp_from_scratch.gpt.mesh import coordinates, setup_mesh
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.parallelize import gpt_to_tp, shard_tensor
from tp_from_scratch.gpt.step import forward_backward, train_step
from tp_from_scratch.gpt.vit import N_CLASSES, init_vit, vit_config, vit_to_tp
from tp_from_scratch.nn import mappings
from tp_from_scratch.nn.mappings import all_gather
from tp_from_scratch.testing import rank_rng, random_array

from . import cost, train
from .pipeline import PipelineStage, measured_bubble, pipeline_step
from .schedules import bubble_formula
from .zero import ZeroOptimizer, chunk_bounds, optimizer_state_bytes


# 5 blocks: uneven over 2 stages (3 + 2) and 3 stages (2 + 2 + 1); vocab 11 splits unevenly
# over tp=2; one KV head, replicated on both TP ranks
CONFIG = dict(vocab_size=11, seq_len=8, n_layers=5, hidden=16, n_heads=2, n_kv_heads=1)
# the ViT: 3 blocks (2 + 1 over 2 stages, 1 + 1 + 1 over 3), 2 heads split over tp=2; 8x8
# images in 2x2 patches, so P+1 = 17 tokens of H = 16 travel between stages
VIT_CONFIG = dict(hidden=16, n_heads=2, n_layers=3, ffn=32)
SEED, BATCH, LR, IMAGE = 11, 4, 1e-2, 8
# per model: its config, its reproducible single-device model, and its TP version
MODELS = {"gpt": (lambda: GPTConfig(**CONFIG), init_gpt, gpt_to_tp),
          "vit": (lambda: vit_config(**VIT_CONFIG), init_vit, vit_to_tp)}


def global_batches(steps, config, batch=BATCH, seed=SEED, kind="gpt"):
    """(inputs, targets) pairs, one per step, the same on every rank: random token ids (B, T)
    and next tokens (B, T) for the GPT; random images (B, 8, 8) and labels (B,) for the ViT."""
    out = []
    for step in range(steps):
        rng = rank_rng(seed, step)
        if kind == "vit":
            out.append((torch.from_numpy(random_array(rng, (batch, IMAGE, IMAGE))),
                        torch.from_numpy(rng.integers(0, N_CLASSES, batch))))
        else:
            out.append(tuple(torch.from_numpy(rng.integers(0, config.vocab_size, (batch, config.seq_len)))
                             for _ in range(2)))
    return out


def new_model(config, kind="gpt"):
    """The float64 single-device model every rank and the reference start from (same seed)."""
    return MODELS[kind][1](config, seed=SEED, dtype=torch.float64)


def single_device_training(config, batches, lr=LR, kind="gpt"):
    """Losses and gradients of every step on one device, and the parameters after the last."""
    model = new_model(config, kind)
    optimizer = optim.AdamW(model.parameters(), lr=lr)
    grads = []

    def keep_gradients(model):   # between backward and the optimizer step
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})

    steps = [(train_step(model, optimizer, idx, targets, after_backward=keep_gradients), grads[-1])
             for idx, targets in batches]
    return steps, dict(model.named_parameters())


def check_pipeline_training(comm, reference, batches, n_micro, schedule, tp_group=None, lr=LR, config=None,
                            kind="gpt"):
    """Train this rank's stage on ``batches`` and assert it equals ``reference`` at every step.

    comm: the pipeline communicator (one rank per stage); tp_group: the stage's TP group
    (None: no TP); config: the GPTConfig ``reference`` was trained with (default: the model's
    in MODELS); kind: "gpt" or "vit". Returns the last step's StepResult.
    """
    config = config or MODELS[kind][0]()
    model = new_model(config, kind)
    tp, tp_rank = 1, 0
    if tp_group is not None:
        model = MODELS[kind][2](tp_group, model)
        tp, tp_rank = mappings.tp_world_size(tp_group), mappings.tp_rank(tp_group)
    stage = PipelineStage(comm, model)
    optimizer = optim.AdamW(stage.parameters(), lr=lr)
    where = f"stage {comm.rank} tp rank {tp_rank} ({schedule}, m={n_micro})"
    steps, final = reference
    for k, (idx, targets) in enumerate(batches):
        result = pipeline_step(stage, optimizer, idx, targets, n_micro, schedule)
        loss, grads = steps[k]
        # the pipeline's loss is the weighted sum of micro-batch losses: the batch mean
        # the policy's growth rule: step k's loss and gradients went through n_layers blocks and k steps
        bound = tolerance(loss.dtype, layers=config.n_layers, steps=k)
        assert_matches_reference(torch.tensor(result.loss, dtype=loss.dtype), loss,
                                 name=f"loss of step {k}", rank=where, tol=bound)
        for name, p in stage.named_parameters():
            expected = shard_tensor(name, grads[name], tp, tp_rank, config)
            assert_matches_reference(p.grad, expected, name=f"grad of {name} at step {k}", rank=where, tol=bound)
    # the weights: AdamW amplifies a near-zero gradient's roundoff by up to lr / eps
    bound = tolerance(loss.dtype, layers=config.n_layers, steps=len(batches), adamw_lr=lr)
    for name, p in stage.named_parameters():
        expected = shard_tensor(name, final[name].detach(), tp, tp_rank, config)
        assert_matches_reference(p.detach(), expected, name=f"{name} after {len(batches)} AdamW steps",
                                 rank=where, tol=bound)
    return result


def split_comm(comm, tp):
    """(pipeline communicator, TP group) of this rank in the dp=1 x pp x tp mesh of mesh.py.

    torch: the pipeline's messages go through a TorchComm over the gloo PP group, the TP
    collectives through the native TP ProcessGroup; MPI: two MPIComms from MPI_Comm_split.
    """
    if tp == 1:
        return comm, None
    if comm.world_size % tp:
        raise ValueError(f"rank {comm.rank}: world size {comm.world_size} is not divisible by tp={tp}")
    n_stages = comm.world_size // tp
    _, stage, tp_rank = coordinates(comm.rank, 1, n_stages, tp)
    if type(comm).__name__ == "MPIComm":
        from tp_from_scratch.comm import MPIComm
        return (MPIComm(comm.mpi.Split(color=tp_rank, key=stage)),
                MPIComm(comm.mpi.Split(color=stage, key=tp_rank)))
    if type(comm).__name__ != "TorchComm":
        raise ValueError(f"rank {comm.rank}: tp={tp} needs processes (torchrun or mpiexec), "
                         f"not {type(comm).__name__}")
    from tp_from_scratch.comm import TorchComm
    mesh = setup_mesh(tp, timeout=comm.timeout, pp=n_stages)
    return TorchComm(group=mesh.pp_group), mesh.tp_group


def pipeline_report(comm, tp=1, micro=(1, 4), steps=2, models=("gpt", "vit")):
    """Every model, schedule and micro-batch count on this rank; prints the measured bubble on rank 0."""
    pp_comm, tp_group = split_comm(comm, tp)
    p = pp_comm.world_size
    for kind in models:
        config = MODELS[kind][0]()
        batches = global_batches(steps, config, kind=kind)
        reference = single_device_training(config, batches, kind=kind)
        for schedule in ("gpipe", "1f1b"):
            for m in micro:
                result = check_pipeline_training(pp_comm, reference, batches, m, schedule, tp_group, kind=kind)
                measured = measured_bubble(pp_comm, result.timeline)
                if comm.rank == 0:  # the GPT's line names no model (as before the ViT came)
                    print(f"pp={p} tp={tp} {schedule} m={m}{', ViT' if kind == 'vit' else ''}: {steps} steps "
                          f"equal to one device; bubble {measured['fraction']:.2f} measured, "
                          f"{bubble_formula(p, m):.2f} = (p-1)/(m+p-1); in flight on stage 0: "
                          f"{result.peak_in_flight}", flush=True)
    if pp_comm is not comm:
        pp_comm.close()  # wait for its last sends: they go unsent if the comm is dropped first
    if comm.rank == 0:
        print(f"pipeline check passed on {type(pp_comm).__name__}", flush=True)


ZERO_STEPS = 3   # ZeRO's LR is the pipeline's, 1e-2


def small_model():
    """58 parameters (7*5 + 5 + 5*3 + 3), float64, the same on every rank (its own generator)."""
    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return model


def zero_batch(rank, step):
    """Rank ``rank``'s rows at ``step``: inputs (4, 7) and targets (4, 3)."""
    rng = rank_rng(100 + step, rank)
    return torch.from_numpy(random_array(rng, (4, 7))), torch.from_numpy(random_array(rng, (4, 3)))


def adamw(params):
    return optim.AdamW(params, lr=LR, betas=(0.9, 0.95), weight_decay=0.1)


def zero_reference(dp, steps=ZERO_STEPS):
    """Unsharded AdamW on one device: (parameters after every step, the optimizer)."""
    model = small_model()
    opt = adamw(model.parameters())
    after = []
    for s in range(steps):
        # Lesson 6's step, its batch every rank's rows: the mean loss over all of them
        train_step(model, opt, s, dp, run_batch=partial(forward_backward, loss_fn=every_ranks_loss))
        after.append([(name, p.detach().clone()) for name, p in model.named_parameters()])
    return after, opt


def every_ranks_loss(model, step, dp):
    """The mean squared error over the rows of all ``dp`` ranks at ``step``."""
    return sum(torch.nn.functional.mse_loss(model(x), y) for x, y in (zero_batch(r, step) for r in range(dp))) / dp


def squared_error(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def zero_run(comm, stage, steps=ZERO_STEPS, gradient_reduce="reduce_scatter"):
    """ZeRO on this rank: (parameters after every step, optimizer state bytes, gradient bytes kept).

    gradient_reduce: "reduce_scatter" (the paper's ZeRO) or "all_reduce" (the naive first ZeRO-1)."""
    model = small_model()
    opt = ZeroOptimizer(comm, model.parameters(), stage, adamw, gradient_reduce)
    after = []
    for s in range(steps):
        # Lesson 6's step on this rank's rows; ZeroOptimizer.step averages the gradients itself
        train_step(model, opt, *zero_batch(comm.rank, s), run_batch=partial(forward_backward, loss_fn=squared_error))
        after.append([p.detach().clone() for p in model.parameters()])
    return after, opt.state_bytes(), opt.gradient_bytes()


def zero_report(comm):
    """Check ZeRO-1 and ZeRO-2 on ``comm`` against the reference; rank 0 prints one line each."""
    dp, r = comm.world_size, comm.rank
    expected, opt = zero_reference(dp)
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
            print(f"dp={dp} {label}: parameters equal to unsharded AdamW after each of {ZERO_STEPS} steps; "
                  f"optimizer state per rank {states} bytes (unsharded {whole}); "
                  f"{type(comm).__name__}", flush=True)
    return True


def mesh_check(variants):
    """Run every (args, mesh) variant with Lesson 11's trainer; returns 1 if any check fails
    (decided on rank 0)."""
    failures, first_losses = 0, None
    for args, mesh in variants:
        mesh_run = train.MeshRun(args, mesh)
        status = train.run(args, mesh, mesh_run)
        if mesh.rank != 0:
            continue
        record, config = mesh_run.record, args.model
        problems = cost.differences(record) + cost.zero_shards_add_up(record)
        if status:
            problems.append("a step differs from the single-device loss (the lines above say which)")
        if first_losses is None:
            first_losses = record["losses"]
        else:
            try:
                dtype = getattr(torch, args.dtype)   # the run's precision sets the tolerance
                # every step's loss at once: the bound of the last step (the policy's growth rule)
                assert_matches_reference(torch.tensor(record["losses"], dtype=dtype),
                                         torch.tensor(first_losses, dtype=dtype),
                                         name="losses against the first variant",
                                         tol=tolerance(dtype, layers=config.n_layers, steps=args.steps - 1))
            except AssertionError as e:
                problems.append(str(e))
        verdict = (f"OK ({args.steps} steps equal to one device; memory and bytes as the cost model "
                   f"predicts)") if not problems else "FAILED: " + "; ".join(problems)
        print(f"variant {record['strategy']}: {verdict}", flush=True)
        failures += bool(problems)
    return 1 if failures else 0


def mesh_main(ours, parser):
    """Parse every --variant with Lesson 11's trainer, build each one's mesh, run mesh_check."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    parsed = []
    for v in ours.variant or [""]:
        args = train.parse(
            [*f"--dp {ours.dp} --pp {ours.pp} --tp {ours.tp} --steps {ours.steps} --compare-single "
               f"--no-progress {ours.common} {v}".split()])
        problem = train.validate(args, world)
        if problem:
            parser.error(f"variant {v!r}: {problem}")
        parsed.append(args)
    def check_all():
        meshes = [setup_mesh(args.tp, args.device, args.timeout, pp=args.pp) for args in parsed]
        return mesh_check(list(zip(parsed, meshes)))
    torch_main(check_all, parsed[0].device, parsed[0].timeout)


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m tp_from_scratch.parallelisms.check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    checks = parser.add_subparsers(dest="check", required=True)
    p = checks.add_parser("pipeline", help="pipeline training against one device")
    p.add_argument("--tp", type=int, default=1, help="TP degree inside each stage (processes only)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--micro", type=int, nargs="+", default=[1, 4], help="micro-batch counts m")
    p.add_argument("--model", nargs="+", choices=list(MODELS), default=list(MODELS),
                   help="the models to check, in order (default: the GPT, then the ViT)")
    checks.add_parser("zero", help="ZeRO-1 and ZeRO-2 against unsharded AdamW")
    m = checks.add_parser("mesh", help="several ways of training on one dp x pp x tp mesh (torchrun)")
    m.add_argument("--dp", type=int, default=1)
    m.add_argument("--pp", type=int, default=1)
    m.add_argument("--tp", type=int, default=1)
    m.add_argument("--steps", type=int, default=3)
    m.add_argument("--variant", action="append", default=[],
                   help="extra trainer flags, written --variant=\"--zero 2\" (with =)")
    m.add_argument("--common", default="", help="flags for every variant, e.g. '--dtype float64'")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    from tp_from_scratch.comm.launch import check_main
    if args.check == "pipeline":
        check_main(lambda comm: pipeline_report(comm, args.tp, args.micro, args.steps, args.model),
                   world_sizes=(2, 3))
    elif args.check == "zero":
        check_main(zero_report)
    else:
        mesh_main(args, parser)


if __name__ == "__main__":
    main()
