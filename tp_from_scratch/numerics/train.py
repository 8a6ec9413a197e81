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
"""
from tp_from_scratch.comm.launch import torch_main
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
    return train.run(opts, mesh, train.Hooks(parallelize=lambda full, group: invariant_tp_gpt(group, full)))


def main(argv=None):
    opts = train.parse_config(build_parser(), validate, argv)
    torch_main(lambda: run(opts, setup_mesh(opts.tp, opts.device, opts.timeout)), opts.device, opts.timeout,
               errors=(ckpt.CheckpointError,))


if __name__ == "__main__":
    main()
