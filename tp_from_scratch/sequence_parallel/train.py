"""Train the GPT tensor- AND sequence-parallel, each step checked against one device (Lesson 7).

    # 2 processes, tp=2, every step's loss next to the single-device loss
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.sequence_parallel.train --tp 2 --compare-single
    # dp=2 x tp=2 on 4 processes, float64, with selective recomputation of the attention core
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.sequence_parallel.train --tp 2 \\
        --dtype float64 --recompute-attention --compare-single
    # the from-scratch ring collectives (TorchComm) under the same processes
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.sequence_parallel.train --tp 4 --collectives scratch
    # PyTorch's own sequence parallelism (DTensor: SequenceParallel, PrepareModuleInput) on the same GPT
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.sequence_parallel.train --tp 2 --impl dtensor --compare-single
    # the checkpoint does not know about SP: save with it at tp=2, resume without it at tp=4
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.sequence_parallel.train --tp 2 --steps 20 --save runs/sp
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.gpt.train --tp 4 --steps 50 --load runs/sp

The command line is Lesson 6's (``.venv/bin/python -m tp_from_scratch.gpt.train --help``) plus
--recompute-attention, and running it means ``--sequence-parallel``: Lesson 6's run (data,
optimizer, checkpoints, metrics, report; every option works the same) with one hook
(gpt.hooks.Hooks.parallelize): the model built sequence-parallel. --impl scratch wraps
the TP model in SequenceParallelGPT (same modules, same state dict, so checkpoints move
freely between the two trainers and any tp); --impl dtensor applies PyTorch's plan
(sequence_parallel/dtensor_plan.py; every --arch, no --save / --load, as in Lesson 6).
"""

from dataclasses import dataclass

from tp_from_scratch.comm.launch import torch_main
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import train
from tp_from_scratch.gpt.mesh import setup_mesh
from tp_from_scratch.gpt.parallelize import gpt_to_tp
from tp_from_scratch.sequence_parallel.model import SequenceParallelGPT


@dataclass(frozen=True)
class SPTrainConfig(train.TrainConfig):
    """Lesson 6's settings plus selective recomputation of the attention core."""
    recompute_attention: bool = False


def build_parser():
    parser = train.build_parser()
    parser.prog, parser.description = "python -m tp_from_scratch.sequence_parallel.train", __doc__
    parser.add_argument("--recompute-attention", action="store_true",
                        help="selective recomputation: keep q, k, v and run the attention core again in backward")
    return parser


def parse(argv=()):
    return SPTrainConfig.from_args(build_parser().parse_args([str(a) for a in argv]))


def validate(opts, world_size):
    """Lesson 6's checks, and what the DTensor plan does not offer; None if fine."""
    if opts.impl == "dtensor" and opts.recompute_attention:
        return "--recompute-attention is ours: run it with --impl scratch"
    return train.validate(opts, world_size)


def sequence_parallelizer(opts, mesh):
    """parallelize(full, group) for gpt.hooks.Hooks: this rank's sequence-parallel model."""
    if opts.impl == "dtensor":   # DTensor imported only here, as in gpt/train.py (~1 s a rank)
        from tp_from_scratch.sequence_parallel.dtensor_plan import parallelize_gpt_sp
        return lambda full, group: parallelize_gpt_sp(full, mesh.device_mesh["tp"])
    return lambda full, group: SequenceParallelGPT(gpt_to_tp(group, full),
                                                   recompute_attention=opts.recompute_attention)


def run(opts, mesh):
    """Lesson 6's run with the sequence-parallel model; 1 if a step differs from one device."""
    if mesh.rank == 0:
        print(f"sequence parallel over tp={mesh.tp} ({opts.impl})"
              + (", attention core recomputed in backward" if opts.recompute_attention else ""), flush=True)
    return train.run(opts, mesh, train.Hooks(parallelize=sequence_parallelizer(opts, mesh)))


def main(argv=None):
    opts = train.parse_config(build_parser(), validate, argv, SPTrainConfig)
    torch_main(lambda: run(opts, setup_mesh(opts.tp, opts.device, opts.timeout, dtensor=opts.impl == "dtensor")),
               opts.device, opts.timeout, errors=(ckpt.CheckpointError,))


if __name__ == "__main__":
    main()
