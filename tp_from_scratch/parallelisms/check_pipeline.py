"""Check pipeline training against one device, on the simulator, torchrun or mpiexec.

    .venv/bin/python -m tp_from_scratch.parallelisms.check_pipeline                                           # simulated, pp = 2, 3
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.parallelisms.check_pipeline --tp 2  # pp=2 x tp=2
    .venv/bin/mpiexec -n 2 .venv/bin/python -m tp_from_scratch.parallelisms.check_pipeline                    # pp=2
    ... --model vit                                                                                           # the ViT only

For each model (the tiny GPT on token ids, then the tiny ViT on images), schedule (GPipe,
1F1B) and micro-batch count, a few AdamW steps in float64: every step's loss, every gradient
(a TP rank's shard of it) and the parameters after the last step must match single-device
training on the same global batches (``assert_matches_reference``); a mismatch raises on that
rank and ends the job. Ranks are laid out as in mesh.py with dp = 1, TP innermost: rank =
stage * tp + tp_rank, so a stage's TP group are neighbours.
"""
import argparse

import torch

from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.parallelize import gpt_to_tp, shard_tensor
from tp_from_scratch.gpt.vit import N_CLASSES, init_vit, vit_config, vit_to_tp
from tp_from_scratch.nn import mappings
from tp_from_scratch.testing import rank_rng, random_array

from .mesh import coordinates, setup_mesh3d
from .pipeline import PipelineStage, measured_bubble, train_step
from .schedules import bubble_formula

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
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    steps = []
    for idx, targets in batches:
        optimizer.zero_grad(set_to_none=True)
        _, loss = model(idx, targets)
        loss.backward()
        steps.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        optimizer.step()
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
    optimizer = torch.optim.AdamW(stage.parameters(), lr=lr)
    where = f"stage {comm.rank} tp rank {tp_rank} ({schedule}, m={n_micro})"
    steps, final = reference
    for k, (idx, targets) in enumerate(batches):
        result = train_step(stage, optimizer, idx, targets, n_micro, schedule)
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
    mesh = setup_mesh3d(1, n_stages, tp, timeout=comm.timeout)
    return TorchComm(group=mesh.pp_group), mesh.tp_group


def report(comm, tp=1, micro=(1, 4), steps=2, models=("gpt", "vit")):
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=1, help="TP degree inside each stage (processes only)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--micro", type=int, nargs="+", default=[1, 4], help="micro-batch counts m")
    parser.add_argument("--model", nargs="+", choices=list(MODELS), default=list(MODELS),
                        help="the models to check, in order (default: the GPT, then the ViT)")
    args = parser.parse_args(argv)
    from tp_from_scratch.comm.launch import check_main
    check_main(lambda comm: report(comm, args.tp, args.micro, args.steps, args.model), world_sizes=(2, 3))


if __name__ == "__main__":
    main()
