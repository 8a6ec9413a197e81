"""Train the GPT tensor- AND sequence-parallel, each step checked against one device (Lesson 7).

    # 2 processes, tp=2, every step's loss next to the single-device loss
    torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.sequence_parallel.train --tp 2 --compare-single
    # dp=2 x tp=2 on 4 processes, float64, with selective recomputation of the attention core
    torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.sequence_parallel.train --tp 2 \\
        --dtype float64 --recompute-attention --compare-single
    # the from-scratch ring collectives (TorchComm) under the same processes
    torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.sequence_parallel.train --tp 4 --collectives scratch

The command line is Lesson 6's (``python -m tp_from_scratch.gpt.train --help``) plus
--recompute-attention; the run is Lesson 6's training loop, data, optimizer and report, with
the model wrapped in SequenceParallelGPT. --impl dtensor, --save and --load are not offered here.
"""
import os
import sys
import time

import torch

from tp_from_scratch.gpt import train
from tp_from_scratch.gpt.mesh import setup_mesh
from tp_from_scratch.gpt.model import gpt_to_tp, init_gpt
from tp_from_scratch.gpt.traffic import CollectiveCounter
from tp_from_scratch.sequence_parallel.model import SequenceParallelGPT


def build_parser():
    parser = train.build_parser()
    parser.prog, parser.description = "python -m tp_from_scratch.sequence_parallel.train", __doc__
    parser.add_argument("--recompute-attention", action="store_true",
                        help="selective recomputation: keep q, k, v and run the attention core again in backward")
    return parser


def validate(args, world_size):
    """Lesson 6's checks, and what this script does not offer; None if fine."""
    if args.impl != "scratch" or args.save or args.load:
        return "sequence_parallel.train runs --impl scratch without --save / --load"
    return train.validate(args, world_size)


def run(args, config, mesh):
    """Build the SP model on this rank, train with Lesson 6's loop, report; 1 if a step differs."""
    group = train.tp_group_for(args, mesh)
    full = init_gpt(config, args.seed, getattr(torch, args.dtype))  # the same weights on every rank
    model = SequenceParallelGPT(gpt_to_tp(group, full).to(mesh.device),
                                recompute_attention=args.recompute_attention)
    optimizer = train.make_optimizer(model.parameters(), args)
    train.report_memory(args, model, config, mesh)
    compare = (args.compare_single or args.plot) and mesh.rank == 0
    reference = train.single_device_run(config, args) if compare else None
    counter = CollectiveCounter({mesh.tp_group: "tp", mesh.dp_group: "dp"})
    start = time.perf_counter()
    losses, ref_losses, bad = train.train_loop(args, config, mesh, model, optimizer, 0, reference, counter)
    if mesh.rank == 0:
        print(f"sequence parallel over tp={mesh.tp}"
              + (", attention core recomputed in backward" if args.recompute_attention else ""))
        train.report(args, mesh, group, counter, 0, losses, ref_losses, bad, time.perf_counter() - start)
    return 1 if bad else 0


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = validate(args, int(os.environ.get("WORLD_SIZE", "1")))
    if problem:
        if int(os.environ.get("RANK", "0")) == 0:
            parser.error(problem)  # prints usage and the message, exits with status 2
        sys.exit(2)
    mesh = setup_mesh(args.tp, args.device, args.timeout)
    train.run_and_exit(run, args, train.config_from_args(args), mesh)


if __name__ == "__main__":
    main()
