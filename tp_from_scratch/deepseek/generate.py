"""Greedy generation with DeepSeek-V3 from a Hugging Face save_pretrained directory or a training
checkpoint, on t ranks, decoding with the latent cache (model.generate; mla.LatentCache).

    # one process
    .venv/bin/python -m tp_from_scratch.deepseek.generate --hf DIR --prompt 1,2,3 --new-tokens 8
    # 2 ranks: heads split, each rank its experts on all tokens; rank 0 also decodes on one device
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.deepseek.generate --hf DIR \\
        --prompt 1,2,3 --new-tokens 8 --compare-single
    # what deepseek.train --save wrote (any --tp, any layout), every expert split over 2 ranks
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.deepseek.generate --load runs/ds \\
        --layout etp --new-tokens 8 --compare-single

DIR is what DeepseekV3ForCausalLM.save_pretrained (or model.save_hf) writes; --load takes a
checkpoint root of deepseek.train --save or deepseek.convert import. The prompt, the
flag checks and the process group are gpt/generate.py's; the model and its cache Lesson 12's.
Greedy only, all --new-tokens (no stop at an end-of-sequence id).
"""
import argparse

import torch
import torch.distributed as dist

from tp_from_scratch.comm import Comm
from tp_from_scratch.comm.launch import torch_main
from tp_from_scratch.gpt import options
from tp_from_scratch.gpt.generate import parse_prompt, positions_problem, prompt_problem
from tp_from_scratch.nn.mappings import tp_world_size

from .convert import load_model
from .model import generate, load_hf

LAYOUTS = {"tp": "experts on all tokens", "etp": "expert tensor parallel"}


def build_parser():
    p = argparse.ArgumentParser(prog="python -m tp_from_scratch.deepseek.generate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--hf", help="a DeepseekV3 save_pretrained directory")
    source.add_argument("--load", help="a checkpoint root (deepseek.train --save, deepseek.convert import)")
    p.add_argument("--prompt", help="comma-separated token ids (default: 8 random ids from --seed)")
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--layout", choices=list(LAYOUTS), default="tp",
                   help="tp: each rank its experts on all tokens; etp: every expert split over the ranks")
    p.add_argument("--compare-single", action="store_true", help="rank 0 also generates on one device")
    return p


def check_arguments(args, world):
    return options.first_problem(options.existing_path("--hf", args.hf), options.existing_path("--load", args.load),
                                 prompt_problem(args.prompt),
                                 options.positive("--new-tokens", args.new_tokens))


def load(args, group, layout):
    """The model of --hf or --load on this rank, in ``layout``, in --dtype."""
    dtype = getattr(torch, args.dtype)
    if args.hf:
        return load_hf(args.hf, group=group, layout=layout, dtype=dtype).eval()
    return load_model(args.load, group=group, layout=layout, dtype=dtype)[0].eval()


def max_positions(config):
    """(the model's positions, where that number comes from): max_position_embeddings, or
    transformers' DeepseekV3Config default (4096) when the config names none."""
    given = getattr(config, "max_position_embeddings", None)
    if given is None:
        return 4096, "transformers' default max_position_embeddings: the config names none"
    return given, "max_position_embeddings"


def run(args, group, rank):
    model = load(args, group, LAYOUTS[args.layout])
    prompt = parse_prompt(args.prompt, model.config, args.seed)
    problem = positions_problem(prompt, args.new_tokens, *max_positions(model.config), feeds_last=True)
    if problem:
        raise ValueError(problem)
    ids, cache = generate(model, prompt, args.new_tokens)
    if rank != 0:
        return 0
    print(f"deepseek_v3, tp={tp_world_size(group)} ({LAYOUTS[args.layout]}), {args.dtype}, greedy: "
          f"{','.join(map(str, ids[0].tolist()))}", flush=True)
    if not args.compare_single:
        return 0
    single = load(args, Comm(0, 1), LAYOUTS["tp"])
    same = torch.equal(ids, generate(single, prompt, args.new_tokens)[0])
    print(f"single device: {'identical token ids' if same else 'DIFFERENT token ids'}", flush=True)
    return int(not same)


def main(argv=None):
    args = options.parse_valid_args(build_parser(), check_arguments, argv)

    def on_this_rank():
        world = dist.get_world_size()
        return run(args, dist.group.WORLD if world > 1 else Comm(0, 1), dist.get_rank())
    torch_main(on_this_rank, errors=(ValueError,))

if __name__ == "__main__":
    main()
