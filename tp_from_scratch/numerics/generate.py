"""Generate with the TP-invariant GPT: Lesson 6's gpt.generate with the model built from Lesson
13's layers, so the generated ids have the same bits at every t that divides the tree's 8 leaves.

    # a tiny random model saved as a single-device checkpoint, then greedy ids at t = 1 and t = 2
    .venv/bin/python -m tp_from_scratch.numerics.train --vocab-size 64 --hidden 64 --steps 2 --save runs/invariant
    .venv/bin/torchrun --standalone --nproc-per-node 1 -m tp_from_scratch.numerics.generate --load runs/invariant --prompt 1,2,3 --new-tokens 20
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.numerics.generate --load runs/invariant --prompt 1,2,3 --new-tokens 20

The command line, the loop (prefill, then decode with the KV cache), the sampling and the
report are gpt.generate's (``.venv/bin/python -m tp_from_scratch.gpt.generate --help``); its one
hook (``parallelize``) builds numerics.model.invariant_tp_gpt at every t, t = 1 included (the
plain GPT at t = 1 sums in another order). What the fixed tree cannot serve is refused by name
(numerics.check_invariant). The ids' bits are the logits': at a decode step B*T = 1, so the
MLP's activation is invariant when F/t is a multiple of ATen's element-wise step (32 float32
covers AVX2 and AVX512; numerics/layers.py). --compare-single compares with the plain
single-device GPT, which is not bit-equal to the invariant one: equal ids there are likely, not
promised.
"""
import torch.distributed as dist

from tp_from_scratch.gpt import generate
from tp_from_scratch.numerics.model import invariant_tp_gpt


def invariant_model(group, single, tp):
    """gpt.generate's ``parallelize`` hook: this rank's invariant GPT (the world of one at t = 1)."""
    return invariant_tp_gpt(group if group is not None else dist.group.WORLD, single)


def build_parser():
    parser = generate.build_parser()
    parser.prog, parser.description = "python -m tp_from_scratch.numerics.generate", __doc__
    return parser


def main(argv=None):
    generate.main(argv, parser=build_parser(), parallelize=invariant_model)


if __name__ == "__main__":
    main()
