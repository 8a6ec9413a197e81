"""Train the GPT tensor- AND sequence-parallel, each step checked against one device (Lesson 7).

    # 2 processes, tp=2, every step's loss next to the single-device loss
    torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.sequence_parallel.train --tp 2 --compare-single
    # dp=2 x tp=2 on 4 processes, float64, with selective recomputation of the attention core
    torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.sequence_parallel.train --tp 2 \\
        --dtype float64 --recompute-attention --compare-single
    # the from-scratch ring collectives (TorchComm) under the same processes
    torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.sequence_parallel.train --tp 4 --collectives scratch
    # PyTorch's own sequence parallelism (DTensor: SequenceParallel, PrepareModuleInput) on the same GPT
    torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.sequence_parallel.train --tp 2 --impl dtensor --compare-single
    # the checkpoint does not know about SP: save with it at tp=2, resume without it at tp=4
    torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.sequence_parallel.train --tp 2 --steps 20 --save runs/sp
    torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.gpt.train --tp 4 --steps 50 --load runs/sp

The command line is Lesson 6's (``python -m tp_from_scratch.gpt.train --help``) plus
--recompute-attention, and running it means ``--sequence-parallel``: Lesson 6's run (data,
optimizer, checkpoints, report) with the model built sequence-parallel. --impl scratch wraps
the TP model in SequenceParallelGPT (same modules, same state dict, so checkpoints move
freely between the two trainers and any tp); --impl dtensor applies PyTorch's plan
(sequence_parallel/dtensor_plan.py; every --arch, no --save / --load, as in Lesson 6).
"""

from tp_from_scratch.gpt import train
from tp_from_scratch.gpt.mesh import setup_mesh
from tp_from_scratch.gpt.model import gpt_to_tp
from tp_from_scratch.sequence_parallel.dtensor_plan import parallelize_gpt_sp
from tp_from_scratch.sequence_parallel.model import SequenceParallelGPT


def build_parser():
    parser = train.build_parser()
    parser.prog, parser.description = "python -m tp_from_scratch.sequence_parallel.train", __doc__
    parser.add_argument("--recompute-attention", action="store_true",
                        help="selective recomputation: keep q, k, v and run the attention core again in backward")
    return parser


def validate(args, world_size):
    """Lesson 6's checks, and what the DTensor plan does not offer; None if fine."""
    if args.impl == "dtensor" and args.recompute_attention:
        return "--recompute-attention is ours: run it with --impl scratch"
    return train.validate(args, world_size)


def sequence_parallelizer(args, mesh):
    """parallelize(full, group) for gpt.train.build: this rank's sequence-parallel model."""
    if args.impl == "dtensor":
        return lambda full, group: parallelize_gpt_sp(full, mesh.device_mesh["tp"])
    return lambda full, group: SequenceParallelGPT(gpt_to_tp(group, full),
                                                   recompute_attention=args.recompute_attention)


def run(args, config, mesh):
    """Lesson 6's run with the sequence-parallel model; 1 if a step differs from one device."""
    if mesh.rank == 0:
        print(f"sequence parallel over tp={mesh.tp} ({args.impl})"
              + (", attention core recomputed in backward" if args.recompute_attention else ""), flush=True)
    return train.run(args, config, mesh, parallelize=sequence_parallelizer(args, mesh))


def main(argv=None):
    args = train.parse_valid_args(build_parser(), validate, argv)
    mesh = setup_mesh(args.tp, args.device, args.timeout, dtensor=args.impl == "dtensor")
    train.run_and_exit(run, args, train.config_from_args(args), mesh)


if __name__ == "__main__":
    main()
