"""When does tensor parallelism speed decoding up? The planner's inference mode, on the command line.

    # a Llama-3-70B-like model on one 8-GPU NVLink node: one decode step by t, and the sweep
    # over batch and context that says where t = 8 pays, and by how much
    .venv/bin/python -m tp_from_scratch.inference.planner --arch llama --vocab-size 128256 --layers 80 \\
        --hidden 8192 --heads 64 --kv-heads 8 --ffn 28672 --batch-size 1 --context 8192 --sweep --profile h100-nvlink
    # the same across PCIe, or across two nodes (without --profile: this machine's, once --calibrate wrote it)
    ... --profile h100-pcie        ... --profile h100-infiniband
    # this machine: measure it (memory bandwidth, decode overhead, gloo's all-reduce), then plan
    .venv/bin/python -m tp_from_scratch.inference.planner --calibrate     # writes runs/inference_profile.json
    .venv/bin/python -m tp_from_scratch.inference.planner --arch llama --layers 4 --hidden 512 --heads 8 \\
        --kv-heads 4 --vocab-size 4096 --batch-size 1 --context 96 --dtype float32 --profile runs/inference_profile.json

The model flags are the trainer's (gpt.options declares them for both). What it
prints, for TP rank 0 (latency.py has the formulas): memory per rank (weights and KV cache,
and whether they fit the device), then per t the time of one decode step of --batch-size
sequences with --context tokens cached: the weights and cache read at memory bandwidth (or the
FLOPs, if slower), the 2L + 1 all-reduces, the token choice's exchange (--sampling), this CPU's
overhead; and the prefill of a --prompt-len prompt. --spd-blocks k drops k attention
all-reduces (Sync-Point Drop), --bits b < 16 quantizes the row-parallel all-reduces.
"""
import argparse
import sys
from pathlib import Path

from tp_from_scratch.cost.planner import config_from_args  # the GPTConfig of the trainer's size flags
from tp_from_scratch.gpt.options import (add_model_flags, first_problem, json_file,
                                         parse_valid_args, positive)
from tp_from_scratch.inference.calibrate import calibrate
from tp_from_scratch.inference.latency import (MEASURED, PROFILES, decode_step, decode_table, fits, load_profile,
                                               memory_per_rank, prefill)
from tp_from_scratch.inference.quantized import SCHEMES, UNQUANTIZED

ITEMSIZE = {"bfloat16": 2, "float32": 4, "float64": 8}
DEFAULT_PROFILE = "h100-nvlink"


def build_parser():
    p = argparse.ArgumentParser(prog="python -m tp_from_scratch.inference.planner", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, nargs="+", default=None, help="TP degrees (default: 1 2 4 8 that fit the model)")
    p.add_argument("--context", type=int, default=None, help="tokens cached per sequence (default --seq-len)")
    p.add_argument("--prompt-len", type=int, default=None, help="the prefill's prompt (default --context)")
    p.add_argument("--dtype", choices=list(ITEMSIZE), default="bfloat16", help="weights, cache and messages")
    p.add_argument("--profile", default=None,
                   help=f"a GPU profile ({', '.join(PROFILES)}) or a JSON from --calibrate; default "
                        f"{MEASURED} when it exists, else {DEFAULT_PROFILE}")
    p.add_argument("--sampling", choices=["gathered", "sharded"], default="gathered",
                   help="gathered: all-gather the logits (gpt.generate today); sharded: inference.sampling")
    p.add_argument("--top-k", type=int, default=0, help="with --sampling sharded: one more exchange of k scores")
    p.add_argument("--spd-blocks", type=int, default=0, help="blocks whose attention all-reduce is dropped")
    p.add_argument("--bits", type=int, default=UNQUANTIZED, help="1..8: quantized row-parallel all-reduces; 16: not")
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--scheme", choices=list(SCHEMES), default="two_step")
    p.add_argument("--sweep", action="store_true", help="also the decode step by batch (1 8 32 128) and context")
    p.add_argument("--calibrate", action="store_true", help=f"measure this machine, write --profile ({MEASURED})")
    p.add_argument("--batch-size", type=int, default=8, help="sequences decoded at once")
    # the trainer's model flags; --kv-heads not given: the architecture's (gpt2: --heads)
    add_model_flags(p, defaults={"n_kv_heads": None}, helps={"n_kv_heads": "default: gpt2 --heads, else 4"})
    return p


def profile_name(args):
    if args.profile:
        return args.profile
    return MEASURED if Path(MEASURED).exists() else DEFAULT_PROFILE


def validate(args, world=1):
    """The first problem with the flags, as one sentence; None if fine."""
    problem = first_problem(
        *(positive(flag, value) for flag, value in (
            ("--batch-size", args.batch_size), ("--context", args.context), ("--prompt-len", args.prompt_len),
            ("--group-size", args.group_size))),
        *(positive("--tp", t) for t in args.tp or []),
        None if args.top_k >= 0 else f"--top-k must be at least 0 (0: none), got {args.top_k}",
        None if args.bits in (*range(1, 9), UNQUANTIZED) else f"--bits must be 1..8 or 16, got {args.bits}",
        None if 0 <= args.spd_blocks <= args.n_layers else
        f"--spd-blocks must be 0..{args.n_layers} (--layers), got {args.spd_blocks}")
    if problem or args.calibrate:
        return problem
    config = config_from_args(args)
    for t in args.tp or []:
        try:
            config.validate(t)
        except ValueError as e:
            return f"--tp {t}: {e}"
    name = profile_name(args)
    if name not in PROFILES:
        data, problem = json_file("--profile", name)
        if problem:
            return problem + f"; run --calibrate, or pass a profile ({', '.join(PROFILES)})"
        if not isinstance(data, dict) or "memory_bytes_per_s" not in data or "all_reduce" not in data:
            return f"--profile {name}: not an inference profile (no memory_bytes_per_s or all_reduce); run --calibrate"
    return None


def degrees(args, config):
    if args.tp:
        return args.tp
    out = []
    for t in (1, 2, 4, 8):
        try:
            config.validate(t)
            out.append(t)
        except ValueError:
            pass
    return out


def report(args, config, profile, say=print):
    """The planner's inference tables as text."""
    itemsize, B = ITEMSIZE[args.dtype], args.batch_size
    context = args.context or config.seq_len
    prompt = args.prompt_len or context
    options = dict(sampling=args.sampling, top_k=args.top_k, spd_blocks=args.spd_blocks, bits=args.bits,
                   group_size=args.group_size, scheme=args.scheme)
    ts = degrees(args, config)
    say(f"{args.arch}: V={config.vocab_size} L={config.n_layers} H={config.hidden} nh={config.n_heads} "
        f"nkv={config.n_kv_heads} F={config.ffn}, {args.dtype}; B={B}, context {context}, prompt {prompt}")
    say(f"profile {profile['name']}: {profile['source']}")
    say(f"sampling {args.sampling}" + (f" top-{args.top_k}" if args.top_k else "")
        + (f"; SPD on {args.spd_blocks} blocks" if args.spd_blocks else "")
        + (f"; all-reduces {args.bits}-bit ({args.scheme}, groups of {args.group_size})" if args.bits != UNQUANTIZED
           else ""))
    say(f"\n{'t':>3} {'weights GB':>10} {'KV GB':>8} {'fits':>5} {'read ms':>8} {'FLOP ms':>8} {'AR ms':>7} "
        f"{'choose ms':>9} {'ovh ms':>7} {'decode ms':>10} {'speedup':>8} {'tokens/s':>9} {'prefill ms':>10}")
    base = None
    for t in ts:
        m = memory_per_rank(config, t, B, context, itemsize)
        d = decode_step(config, profile, t, B, context, itemsize, **options)
        p = prefill(config, profile, t, B, prompt, itemsize, **options)
        base = base or d["step_s"]
        say(f"{t:>3} {m['weights'] / 1e9:>10.2f} {m['kv_cache'] / 1e9:>8.2f} "
            f"{'yes' if fits(config, profile, t, B, context, itemsize) else 'NO':>5} {d['memory_s'] * 1e3:>8.3f} "
            f"{d['compute_s'] * 1e3:>8.3f} {d['all_reduce_s'] * 1e3:>7.3f} {d['sampling_s'] * 1e3:>9.3f} "
            f"{d['overhead_s'] * 1e3:>7.3f} {d['step_s'] * 1e3:>10.3f} {base / d['step_s']:>7.2f}x "
            f"{d['tokens_per_s']:>9.0f} {p['step_s'] * 1e3:>10.2f}")
    say("(read: weights + KV cache at memory bandwidth; FLOP: the same step's arithmetic; the step takes the "
        "larger, then adds the all-reduces, the token choice and the overhead)")
    if args.sweep:
        report_sweep(config, profile, ts, itemsize, options, say)


def report_sweep(config, profile, ts, itemsize, options, say=print, batches=(1, 8, 32, 128), contexts=(1024, 8192)):
    """The decode step by batch and context at every t, and what the largest t buys."""
    top = ts[-1]
    say("\ndecode step (ms) by batch and context; * = does not fit one device's memory")
    say(f"{'batch':>6} {'context':>8} " + " ".join(f"{'t=' + str(t):>9}" for t in ts)
        + f" {'t=' + str(top) + ' vs t=' + str(ts[0]):>13} {'vs smallest t that fits':>24}")
    for row in decode_table(config, profile, batches, contexts, ts, itemsize, **options):
        cells = " ".join(f"{row['steps'][t] * 1e3:>8.2f}{' ' if row['fits'][t] else '*'}" for t in ts)
        smallest = row["smallest_fit"]
        versus = f"{row['speedup_vs_smallest_fit']:.2f}x (t={smallest})" if smallest else "nothing fits"
        say(f"{row['batch']:>6} {row['context']:>8} {cells} {row['speedup']:>12.2f}x {versus:>24}")


def main(argv=None):
    args = parse_valid_args(build_parser(), validate, argv, world=1)
    if args.calibrate:
        path = args.profile if args.profile and args.profile not in PROFILES else MEASURED
        profile = calibrate(path)
        print(f"wrote {path}: memory {profile['memory_bytes_per_s'] / 1e9:.1f} GB/s, decode overhead "
              f"{profile['decode_overhead']['fixed_s'] * 1e3:.3f} ms + {profile['decode_overhead']['per_layer_s'] * 1e3:.3f} "
              f"ms per layer, all-reduce alpha {profile['all_reduce']['native']['alpha_s'] * 1e6:.0f} us per message")
        return 0
    report(args, config_from_args(args), load_profile(profile_name(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
