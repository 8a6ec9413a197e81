"""Hugging Face DeepseekV3ForCausalLM checkpoints in and out of Lesson 12's training checkpoints.

    # a save_pretrained directory -> a checkpoint deepseek.train --load and deepseek.generate --load read
    .venv/bin/python -m tp_from_scratch.deepseek.convert import runs/ds-hf --out runs/ds-imported
    # ... already cut for 2 ranks in the expert-parallel layout (any other still loads: it reshards)
    .venv/bin/python -m tp_from_scratch.deepseek.convert import runs/ds-hf --out runs/ds-ep2 --tp 2 --layout ep
    # a checkpoint (any --tp, any layout) -> a directory DeepseekV3ForCausalLM.from_pretrained reads
    .venv/bin/python -m tp_from_scratch.deepseek.convert export runs/ds-imported --out runs/ds-hf-again

The directory is what ``save_pretrained`` writes (config.json and safetensors files; experts one
by one, as DeepSeek-V3's own files, or stacked, as transformers 5 keeps them in memory). The names
map one to one (``model.hf_name``); only the experts are stacked and unstacked. A config the
course cannot map (another routing method, a RoPE other than plain or YaRN, attention biases, ...) is refused by name
before anything is written (model.check_config), as is a tensor missing, without a place in the
model (but the multi-token-prediction layers, skipped with a warning) or of another shape than
the config makes it (each named with its file and both shapes, before any is stacked), a float8
weight, and a GPT's checkpoint on export. ``pad_token_id`` and ``tie_word_embeddings`` are read
as transformers reads them (model.py). Nothing is downloaded, and transformers is never imported (the tests
use it to check the result).
"""
import argparse

import torch

from tp_from_scratch.comm import Comm
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import options
from tp_from_scratch.gpt.convert import warnings_as_lines

from . import checkpoint as ds_ckpt
from .model import check_config, from_hf_state_dict, hf_name, load_hf, save_hf

LAYOUTS = {"tp": "experts on all tokens", "ep": "expert parallel", "etp": "expert tensor parallel"}


def import_hf(source, root, tp=1, layout="experts on all tokens", dtype=torch.float32):
    """Write the save_pretrained directory ``source`` as a checkpoint of ``tp`` shards; its meta."""
    model = load_hf(source, group=Comm(0, 1), dtype=dtype)   # every tensor checked against the config
    check_config(model.config, tp, layout)
    return ds_ckpt.write(root, model.config, ds_ckpt.state_from_model(model), layout, tp, extra={"imported": True})


def load_model(root, *, group, layout="experts on all tokens", dtype=None):
    """(rank r's ParallelDeepseekV3 in ``layout``, the loaded checkpoint) from a checkpoint saved
    at any t and layout; dtype: default the saved tensors'."""
    loaded = ds_ckpt.load(root)
    sd = {hf_name(k): v for k, v in ds_ckpt.model_state(loaded["model"]).items()}
    dtype = dtype or next(iter(sd.values())).dtype
    return from_hf_state_dict(loaded["config"], sd, group=group, layout=layout, dtype=dtype), loaded


def export_hf(root, directory):
    """Write the checkpoint ``root`` as a save_pretrained directory; the loaded checkpoint."""
    model, loaded = load_model(root, group=Comm(0, 1))
    save_hf(directory, model)
    return loaded


def check_arguments(args, world=1):
    """The first problem with the command line (a sentence), or None: before any file is read."""
    if args.cmd == "export":
        return options.first_problem(options.existing_path("source", args.source),
                                     options.directory_to_write("--out", args.out))
    return options.first_problem(options.existing_path("source", args.source), options.positive("--tp", args.tp),
                                 options.directory_to_write("--out", args.out))


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m tp_from_scratch.deepseek.convert", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    im = sub.add_parser("import", help="a DeepseekV3ForCausalLM save_pretrained directory -> a checkpoint")
    im.add_argument("source", help="save_pretrained directory (or a .safetensors file beside its config.json)")
    im.add_argument("--out", required=True, help="checkpoint root to write")
    im.add_argument("--tp", type=int, default=1, help="shards in the checkpoint (a loader reshards to any t)")
    im.add_argument("--layout", choices=list(LAYOUTS), default="tp",
                    help="how the shards are cut: tp (experts on all tokens), ep or etp")
    im.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ex = sub.add_parser("export", help="a checkpoint (deepseek.train --save, or an import) -> save_pretrained directory")
    ex.add_argument("source")
    ex.add_argument("--out", required=True)
    return parser


def main(argv=None):
    parser = build_parser()
    args = options.parse_valid_args(parser, check_arguments, argv)
    try:
        with warnings_as_lines():
            run(args)
    except (ckpt.CheckpointError, ValueError) as e:
        parser.exit(1, f"error: {e}\n")


def run(args):
    """The import or export the command line asks for (its arguments already checked)."""
    if args.cmd == "import":
        meta = import_hf(args.source, args.out, args.tp, LAYOUTS[args.layout], getattr(torch, args.dtype))
        n = sum(r["bytes"] for r in meta["shards"])
        print(f"wrote {args.out}: deepseek_v3, {args.tp} shard(s), layout {meta['layout']}, {n / 2**20:.1f} MiB")
    else:
        loaded = export_hf(args.source, args.out)
        print(f"wrote {args.out}: config.json and model.safetensors (deepseek_v3, step {loaded['step']}, "
              f"saved at tp={loaded['meta']['tp']}, layout {loaded['meta']['layout']})")

if __name__ == "__main__":
    main()
