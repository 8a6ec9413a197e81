"""The command line of every entry point (trainers, generate, convert, the planner, bench): its
shared flags, declared once, and its checks.

    add_model_flags(parser, defaults)   --arch --vocab-size --seq-len --layers --hidden --heads
                                        --kv-heads --ffn --untied --gelu; their dests are
                                        GPTConfig's fields, so model_config(args) is the model
    add_train_flags(parser, defaults)   a trainer's run: --tp --steps ... --batch-size --data

One rule per kind of flag, one sentence per problem, so the same flag is refused with the same
words wherever it appears. Each rule returns the problem as a sentence, or None when the value
is fine; ``first_problem`` picks the first; ``parse_valid_args`` parses, checks and exits.
"""
import argparse
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional

from tp_from_scratch.comm.launch import refuse
from tp_from_scratch.gpt.arch import ARCHS


def at_least(flag, value, lowest):
    """``--steps must be at least 1, got 0``; None when value is None (flag not given)."""
    if value is None or value >= lowest:
        return None
    return f"{flag} must be at least {lowest}, got {value}"


# the largest size or count a command takes, a signed 32-bit integer's limit: far above any real
# model's sizes (GPT-3 175B's hidden size is 12,288), so a larger value is a slip, not a plan
LARGEST = 2 ** 31 - 1


def at_most(flag, value, highest=LARGEST):
    """``--hidden must be at most 2147483647 (2**31 - 1), got 1000000000000``; None when fine or not given."""
    if value is None or value <= highest:
        return None
    bound = f"{highest} (2**31 - 1)" if highest == LARGEST else f"{highest}"
    return f"{flag} must be at most {bound}, got {value}"


def positive(flag, value):
    """A size, a degree or a count: an integer from 1 to LARGEST."""
    return at_least(flag, value, 1) or at_most(flag, value)


def size_type(flag, lowest=1):
    """argparse's type for a size flag: an integer from ``lowest`` to LARGEST, or the flag's one
    line (raised as argparse.ArgumentError without an argument, so argparse prints it as it stands:
    ``--heads must be at least 1, got 0``). A size is refused while the command line is read, by
    every command that declares it, before any work."""
    def size(text):
        value = int(text)   # not an integer: argparse's own "invalid size value: 'x'"
        problem = at_least(flag, value, lowest) or at_most(flag, value)
        if problem:
            raise argparse.ArgumentError(None, problem)
        return value
    return size


def greater_than_zero(flag, value):
    """A temperature, a timeout, a learning rate: a number strictly above 0."""
    if value is None or value > 0:
        return None
    return f"{flag} must be greater than 0, got {value}"


def divides(flag, value, total, what):
    """``--tp 3 does not divide the 4 heads``: value must divide total."""
    if value is None or value < 1 or total % value == 0:
        return None
    return f"{flag} {value} does not divide {what} ({total})"


def existing_path(flag, path):
    """The file or directory a flag names must exist."""
    if path is None or Path(path).exists():
        return None
    return f"{flag} {path}: no such file or directory"


def _file_above(path):
    """The first directory above ``path`` that exists as a file (so nothing can be created there)."""
    return next((p for p in Path(path).parents if p.exists() and not p.is_dir()), None)


def file_to_write(flag, path):
    """A file a flag will write (its missing directories created): not an existing directory,
    and no file where one of its directories must be."""
    if path is None:
        return None
    if Path(path).is_dir():
        return f"{flag} {path} is a directory, not a file to write"
    if _file_above(path):
        return f"{flag} {path}: {_file_above(path)} is a file, not a directory"
    return None


def directory_to_write(flag, path):
    """A directory a flag will write into (created if missing): neither it nor one of the
    directories above it an existing file."""
    if path is None:
        return None
    if Path(path).exists() and not Path(path).is_dir():
        return f"{flag} {path} is a file, not a directory to write into"
    if _file_above(path):
        return f"{flag} {path}: {_file_above(path)} is a file, not a directory"
    return None


def json_file(flag, path):
    """(the parsed JSON, None) or (None, a sentence naming the file and what is wrong)."""
    problem = existing_path(flag, path)
    if problem:
        return None, problem
    try:
        return json.loads(Path(path).read_text()), None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"{flag} {path}: not a readable JSON file ({e})"


def first_problem(*problems):
    """The first sentence among the rules' results, or None if every rule passed."""
    return next((p for p in problems if p), None)


def parse_valid_args(parser, validate_fn, argv=None, world=None):
    """Parse the command line and check it with ``validate_fn(args, world)`` (a message or None).

    On a problem, argparse's own (a size out of range, an unknown flag) or validate_fn's, rank 0
    prints the usage and the message and exits with status 2, before any work is done: once per
    job, not once per rank, and under torchrun every time (comm.launch.refuse: the other ranks
    wait to be stopped).
    """
    def refused(message):
        refuse(lambda: argparse.ArgumentParser.error(parser, message))   # usage, the message, status 2

    parser.error = refused
    args = parser.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1")) if world is None else world
    problem = validate_fn(args, world)
    if problem:
        refused(problem)
    return args


# ---------------------------------------------------------------------------------------
# The flags every GPT entry point shares, declared here once
# ---------------------------------------------------------------------------------------

# flag -> the GPTConfig field it sets (argparse's dest)
MODEL_FLAGS = {"--arch": "arch", "--vocab-size": "vocab_size", "--seq-len": "seq_len", "--layers": "n_layers",
               "--hidden": "hidden", "--heads": "n_heads", "--kv-heads": "n_kv_heads", "--ffn": "ffn",
               "--untied": "tie_embeddings", "--gelu": "gelu"}
FLAG_OF = {dest: flag for flag, dest in MODEL_FLAGS.items()}
COURSE_MAP = "README.md, The course"   # where each lesson's entry points and models are listed


def architecture(name):
    """--arch's type: one of this lesson's architectures (gpt/arch.py), or one line that points
    to the course map, where each later lesson's models have their own entry points."""
    if name not in ARCHS:
        raise argparse.ArgumentTypeError(f"{name!r} is not one of {', '.join(ARCHS)}: another model is trained "
                                         f"and planned by its own lesson's entry point (see {COURSE_MAP})")
    return name


def add_model_flags(parser, defaults=None, only=None, helps=None, title="model size"):
    """Declare the model-size flags on ``parser`` (dests: GPTConfig's fields); returns their group.

    defaults: {dest: value} over GPTConfig's own (None: "not given"); only: the dests to declare
    (a later lesson's model takes some); helps: {dest: text} beside the default help."""
    wanted = [dest for dest in FLAG_OF if only is None or dest in only]
    d = dict(defaults or {})
    if any(dest not in d for dest in wanted):   # GPTConfig's defaults; imported here, as it imports torch
        from tp_from_scratch.gpt.model import GPTConfig
        d = {f.name: f.default for f in fields(GPTConfig)} | d
    helps = {"ffn": "0: 4 x hidden", "tie_embeddings": "an LM head of its own instead of the embedding",
             "gelu": "exact GeLU (erf) or GPT-2's tanh approximation (the numpy lessons' form); default: "
                     "the architecture's (gpt erf, gpt2 tanh)",
             "arch": "gpt: this course's model; gpt2: LayerNorm, learned positions, all biases, tanh GeLU; "
                     "llama: RMSNorm, RoPE, SwiGLU, no biases, untied head (gpt/model.py)"} | (helps or {})
    g = parser.add_argument_group(title)
    for dest in wanted:
        flag = FLAG_OF[dest]
        if dest == "tie_embeddings":
            g.add_argument(flag, dest=dest, action="store_const", const=False, default=d[dest], help=helps[dest])
        elif dest == "arch":
            g.add_argument(flag, type=architecture, default=d[dest], metavar="{" + ",".join(ARCHS) + "}",
                           help=helps[dest])
        elif dest == "gelu":
            g.add_argument(flag, choices=["erf", "tanh"], default=d[dest], help=helps[dest])
        else:
            g.add_argument(flag, dest=dest, type=size_type(flag, 0 if dest == "ffn" else 1), default=d[dest],
                           help=helps.get(dest),
                           metavar=flag[2:].upper().replace("-", "_"))   # --layers LAYERS, as a reader types it
    return g


def model_config(args, **override):
    """The GPTConfig of the flags add_model_flags declared (``override``: fields set otherwise,
    e.g. vocab_size=256 for --data text). --kv-heads not given (None): the architecture's,
    gpt2's every head, else GPTConfig's default or --heads if fewer."""
    from tp_from_scratch.gpt.model import GPTConfig
    sizes = {dest: getattr(args, dest) for dest in FLAG_OF if hasattr(args, dest)} | override
    if sizes.get("n_kv_heads") is None:
        heads = sizes.get("n_heads", GPTConfig.n_heads)
        sizes["n_kv_heads"] = heads if sizes.get("arch") == "gpt2" else min(GPTConfig.n_kv_heads, heads)
    return GPTConfig(**sizes)


def add_train_flags(parser, d):
    """A trainer's run flags, with the defaults of the settings ``d`` (gpt.train.TrainConfig)."""
    p = parser
    p.add_argument("--tp", type=int, default=d.tp, help="tensor-parallel degree t (divides the world size)")
    p.add_argument("--steps", type=int, default=d.steps, help="train until this step (a resumed run continues)")
    p.add_argument("--seed", type=int, default=d.seed, help="weights and data")
    p.add_argument("--dtype", choices=["float32", "float64"], default=d.dtype)
    p.add_argument("--impl", choices=["scratch", "dtensor"], default=d.impl,
                   help="scratch: tp_from_scratch.nn layers; dtensor: PyTorch's parallelize_module")
    p.add_argument("--collectives", choices=["native", "scratch"], default=d.collectives,
                   help="what the scratch layers' TP group is: the torch ProcessGroup (native "
                        "collectives) or a TorchComm over it (the ring collectives from scratch)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=d.device)
    p.add_argument("--metrics", metavar="PATH", help="JSON Lines, one object per step (rank 0 writes)")
    p.add_argument("--save", metavar="DIR", help="write a sharded checkpoint at the end (and every --save-every)")
    p.add_argument("--save-every", type=int, default=d.save_every, metavar="N")
    p.add_argument("--save-format", choices=["course", "dcp"], default=d.save_format,
                   help="course: this course's sharded files (gpt/checkpoint.py); dcp: PyTorch Distributed "
                        "Checkpoint, which torchtitan and DTensor code read (gpt/dcp.py); --load reads either")
    p.add_argument("--load", metavar="DIR_OR_FILE",
                   help="resume from a checkpoint (any tp), or start from an exported single-device .pt")
    p.add_argument("--compare-single", action="store_true",
                   help="rank 0 also trains the single-device model and prints each loss next to it")
    p.add_argument("--equal-steps", type=int, default=d.equal_steps, metavar="N",
                   help="with --compare-single: exit 1 only if one of the first N steps differs (default: "
                        "any step); two long runs part once training has amplified their roundoff")
    p.add_argument("--plot", metavar="PNG", help="loss curves, TP against single-device (implies --compare-single)")
    p.add_argument("--timeout", type=float, default=d.timeout, help="seconds any collective may wait")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = p.add_argument_group("optimizer and batch")
    g.add_argument("--optimizer", choices=["adamw", "sgd"], default=d.optimizer)
    g.add_argument("--lr", type=float, default=d.lr, help="default 3e-3 (adamw) or 0.3 (sgd)")
    g.add_argument("--batch-size", type=int, default=d.batch_size, help="global batch B (split over dp)")
    g.add_argument("--data", choices=["markov", "text"], default=d.data,
                   help="markov: a seeded Markov chain (known entropy rate); text: bytes of the Python "
                        "standard library's source, V=256 (gpt/text.py)")
    g.add_argument("--clip-grad-norm", type=float, default=d.clip_grad_norm, metavar="MAX",
                   help="scale the gradients by min(1, MAX / (||g|| + 1e-6)) after the DP average, ||g|| "
                        "the 2-norm of the whole model's gradient, each distinct piece counted once "
                        "(gpt/clip.py); the single-device reference clips with torch's clip_grad_norm_")
    g.add_argument("--eval-every", type=int, default=d.eval_every, metavar="N",
                   help="every N steps, the loss on a fixed held-out batch (text: the validation split)")


def train_flag_problem(opts):
    """The first shared trainer flag that is wrong on its own or without the flag it needs; None
    if fine. Every trainer checks these first, so a shared flag is refused with the same words."""
    return first_problem(
        at_least("--steps", opts.steps, 0), positive("--tp", opts.tp), positive("--batch-size", opts.batch_size),
        at_least("--save-every", opts.save_every, 0), at_least("--eval-every", opts.eval_every, 0),
        positive("--equal-steps", opts.equal_steps), greater_than_zero("--timeout", opts.timeout),
        greater_than_zero("--lr", opts.lr), greater_than_zero("--clip-grad-norm", opts.clip_grad_norm),
        "--save-every N saves into --save DIR: give --save too" if opts.save_every and not opts.save else None,
        "--save-format says how --save DIR is written: give --save too"
        if opts.save_format != "course" and not opts.save else None,
        "--equal-steps N says how many steps must equal one device's: give --compare-single or --plot"
        if opts.equal_steps is not None and not opts.compares else None)


# ---------------------------------------------------------------------------------------
# What a run was asked for: the command line, parsed once into a TrainConfig
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a training run; the library reads these, never argparse's namespace.

    Built from the command line in one place (``from_args``); a later lesson's trainer
    subclasses it with its own settings (say, a sync fraction). ``model`` is the model's
    own config (a GPTConfig), from the model-size flags: the sizes live there only.
    """
    tp: int = 1
    steps: int = 50
    seed: int = 0
    dtype: str = "float32"
    impl: str = "scratch"
    collectives: str = "native"
    device: str = "cpu"
    metrics: Optional[str] = None
    save: Optional[str] = None
    save_every: int = 0
    save_format: str = "course"
    load: Optional[str] = None
    compare_single: bool = False
    equal_steps: Optional[int] = None
    plot: Optional[str] = None
    timeout: float = 120.0
    no_progress: bool = False
    optimizer: str = "adamw"
    lr: Optional[float] = None
    batch_size: int = 8
    data: str = "markov"
    eval_every: int = 0
    clip_grad_norm: Optional[float] = None
    model: object = None

    @classmethod
    def from_args(cls, args):
        """The one place an argparse namespace becomes settings: its run flags are the fields,
        its model-size flags become ``model`` (model_of)."""
        ours = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in vars(args).items() if k in ours}, model=cls.model_of(args))

    @classmethod
    def model_of(cls, args):
        """The GPTConfig of the size flags (--data text: bytes, so V = 256)."""
        return model_config(args, **({"vocab_size": 256} if args.data == "text" else {}))

    @property
    def torch_dtype(self):
        import torch
        return getattr(torch, self.dtype)

    @property
    def learning_rate(self):
        return self.lr if self.lr is not None else (3e-3 if self.optimizer == "adamw" else 0.3)

    @property
    def compares(self):
        """Rank 0 trains the single-device reference too (--compare-single, or --plot's curves)."""
        return self.compare_single or self.plot is not None



def parse_config(parser, validate_fn, argv=None, config_class=TrainConfig, world=None):
    """Parse ``argv``, build the ``config_class`` settings and check them with
    ``validate_fn(settings, world)`` (options.parse_valid_args: rank 0 prints, all exit 2)."""
    args = parse_valid_args(parser, lambda a, w: validate_fn(config_class.from_args(a), w), argv, world)
    return config_class.from_args(args)
