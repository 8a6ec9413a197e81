"""Train the TP-invariant GPT: Lesson 6's run with the model built from Lesson 13's layers, so
every loss has the same bits at every t that divides the tree's 8 leaves.

    # t = 1 and t = 2: compare the two runs' --metrics files, loss for loss, bit for bit
    .venv/bin/torchrun --standalone --nproc-per-node 1 -m tp_from_scratch.numerics.train --tp 1 --vocab-size 64 --steps 20 --metrics runs/invariant_t1.jsonl
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.numerics.train --tp 2 --vocab-size 64 --steps 20 --metrics runs/invariant_t2.jsonl

The command line is Lesson 6's (``.venv/bin/python -m tp_from_scratch.gpt.train --help``); the
one hook (gpt.hooks.Hooks.parallelize) builds numerics.model.invariant_tp_gpt instead of the TP
GPT, with the same weights, state dict and checkpoints. What the fixed tree cannot serve is
refused by name before any work (numerics.check_invariant: t dividing 8, sizes divisible by 8,
KV heads; the default vocabulary of 67 is not, hence --vocab-size 64). Invariant across t, not
across dp: the DP average is Lesson 6's all-reduce. It is slow (Lesson 13, section 3).

Under mpiexec it runs on Lesson 2's collectives (MPIComm) through Lesson 6's Comm path
(gpt.train.train_on_comm: the same model, data, optimizer and step; dp = 1, so --tp is the
number of processes), and rank 0 prints every step's loss exactly (Python's repr):

    .venv/bin/mpiexec -n 2 .venv/bin/python -m tp_from_scratch.numerics.train --tp 2 --vocab-size 64 --steps 5

What needs torch.distributed (checkpoints, metrics files, the single-device comparison, plots,
evaluation) is refused there by name.
"""
import os
import sys

from tp_from_scratch.comm.launch import launcher_from_env, torch_main
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import train
from tp_from_scratch.gpt.mesh import setup_mesh
from tp_from_scratch.numerics.layers import check_invariant
from tp_from_scratch.numerics.model import invariant_tp_gpt


def build_parser():
    parser = train.build_parser()
    parser.prog, parser.description = "python -m tp_from_scratch.numerics.train", __doc__
    return parser


def validate(opts, world_size):
    """Lesson 6's checks, then what the invariant layers cannot serve; None if fine."""
    problem = train.validate(opts, world_size)
    if problem:
        return problem
    if opts.impl != "scratch":
        return "numerics.train builds its model from Lesson 13's layers: --impl scratch only"
    try:
        check_invariant(opts.model, opts.tp)
    except ValueError as error:
        return str(error)
    return None


def run(opts, mesh):
    """Lesson 6's run with the invariant GPT; 1 if a step differs from one device."""
    if mesh.rank == 0:
        print(f"TP-invariant GPT over tp={mesh.tp}: the fixed tree of 8 leaves", flush=True)
    return train.run(opts, mesh, train.Hooks(parallelize=invariant))


def invariant(full, group):
    """Lesson 6's Hooks.parallelize: the invariant GPT instead of the TP GPT."""
    return invariant_tp_gpt(group, full)


# TrainConfig's fields that need torch.distributed (a process group, files written by rank 0)
TORCH_ONLY = {"--save": "save", "--load": "load", "--metrics": "metrics", "--compare-single": "compare_single",
              "--plot": "plot", "--equal-steps": "equal_steps", "--eval-every": "eval_every"}


def mpi_rank_and_world():
    """(rank, world size) as mpiexec set them for this process (MPICH's PMI_*, Open MPI's)."""
    for rank, size in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return 0, 1


def validate_mpi(opts, world_size):
    """Under mpiexec (dp = 1, no torch.distributed): the first problem, or None."""
    given = [flag for flag, field in TORCH_ONLY.items() if getattr(opts, field)]
    if given:
        return f"{', '.join(given)}: only under torchrun (under mpiexec numerics.train trains and prints the losses)"
    if opts.tp != world_size:
        return f"--tp {opts.tp} must equal the {world_size} processes of mpiexec (no data parallelism on this path)"
    return validate(opts, world_size)


def mpi_main(argv):
    """mpiexec: every rank trains on MPIComm; rank 0 prints each step's loss, exactly."""
    from tp_from_scratch.comm import spmd_main
    rank, world = mpi_rank_and_world()
    parser = build_parser()
    problem = validate_mpi(train.TrainConfig.from_args(parser.parse_args(argv)), world)
    if problem:
        if rank == 0:
            parser.error(problem)   # usage and the message, status 2
        sys.exit(2)

    def run_on(comm):
        losses = train.train_on_comm(comm, argv, parallelize=invariant)
        if comm.rank == 0:
            print(f"TP-invariant GPT over tp={comm.world_size} on {type(comm).__name__}", flush=True)
            for step, loss in enumerate(losses):
                print(f"step {step:4d}  loss {loss!r}", flush=True)
    spmd_main(run_on)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if launcher_from_env() == "mpi":
        return mpi_main(argv)
    opts = train.parse_config(build_parser(), validate, argv)
    torch_main(lambda: run(opts, setup_mesh(opts.tp, opts.device, opts.timeout)), opts.device, opts.timeout,
               errors=(ckpt.CheckpointError,))


if __name__ == "__main__":
    main()
