"""When does tensor parallelism pay? A cost model of one training step, in formulas you can check.

    # GPT-2 8.3B as in Megatron-LM (2019), Table 1: parameters, memory and bytes need no profile
    .venv/bin/python -m tp_from_scratch.cost.planner --arch gpt2 --hidden 3072 --heads 32 --layers 72 \\
        --vocab-size 51200 --seq-len 1024 --tp 8
    # ... and step times on one 8-GPU NVLink node (vendor-spec preset)
    .venv/bin/python -m tp_from_scratch.cost.planner --arch gpt2 --hidden 3072 --heads 32 --layers 72 \\
        --vocab-size 51200 --seq-len 1024 --tp 8 --profile h100-nvlink
    # measure this machine: matmul FLOP/s per process, seconds per element of each element-wise
    # op, the per-step overhead, alpha and beta of gloo's all-reduce (tp_from_scratch.cost.calibrate)
    .venv/bin/python -m tp_from_scratch.cost.planner --calibrate      # writes runs/profile.json
    # the run the trainer would make with the same flags, on that measured profile
    .venv/bin/python -m tp_from_scratch.cost.planner --tp 2 --profile runs/profile.json

The model flags are the trainer's (gpt/options.py declares both), so you plan the run you launch;
--arch takes this lesson's architectures (another model's lesson has its own planner).
What it prints, for a model of V vocab, T positions, L layers, H hidden, nh / nkv heads of
size hs, F ffn, with t TP ranks, B sequences per DP rank:

* parameters, exactly, per architecture: ``gpt`` (this course's tp_from_scratch.gpt.model.GPT:
  no key bias, learned positions, LayerNorm with bias, tied unless --untied), ``gpt2`` (the
  same plus a key bias, multi-head, tied) and ``llama`` (RMSNorm, SwiGLU, no biases, rotary
  instead of learned positions, untied, grouped-query attention);
* memory per rank for each t: weights, gradients, AdamW state and activations;
* the collectives our trainer makes per step, with the bytes each one sends per rank;
* with a profile (--profile: a preset, or a JSON from --calibrate; runs/profile.json when it
  exists), FLOPs per step (backward = 2x forward, so a step is 3x forward) and a predicted step time
  FLOPs / (matmul FLOP/s) + sum over element-wise ops of (elements * seconds per element)
  + sum over collectives of (messages * alpha + bytes * beta)
  + a measured per-step overhead (fixed + per layer: Python, autograd, the optimizer's loop);
* the TP degree at which one layer's communication takes longer than its compute.

The predicted time assumes no overlap of compute and communication: our trainer has none.
"""
import argparse
import json
import sys
from pathlib import Path

from tp_from_scratch.cost.calibrate import calibrate
# (ELEMENTWISE_PASSES, elementwise_elements and parameters are not used below: Lesson 9 reads the
# planner as one module, `from tp_from_scratch.cost import planner`)
from tp_from_scratch.cost.model import (ELEMENTWISE_PASSES, PRECISIONS, PRESETS, activation_bytes,  # noqa: F401
                                        crossover_tp, elementwise_elements, load_profile, memory_per_rank,
                                        predict_step, traffic, valid_tp_degrees)
from tp_from_scratch.gpt.inventory import architecture, parameter_count, parameters, rounded  # noqa: F401
from tp_from_scratch.gpt.options import (add_model_flags, divides, first_problem, json_file, model_config,
                                         parse_valid_args, positive)

MEASURED = "runs/profile.json"  # where --calibrate writes, and the profile used when it exists

# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------

def config_from_args(args):
    """The GPTConfig the trainer would build from these flags (gpt.options.model_config)."""
    return model_config(args)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m tp_from_scratch.cost.planner", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, default=1, help="the TP degree to predict the step time of")
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--dtype", choices=["float32", "float64", "bfloat16"], default="float32",
                   help="what travels in the all-reduces (the memory table follows --precision)")
    p.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32", help="memory table")
    p.add_argument("--profile", default=None,
                   help=f"step times from: a JSON from --calibrate, or a preset ({', '.join(PRESETS)}); "
                        f"default {MEASURED} when it exists, else no step times")
    p.add_argument("--collectives", choices=["native", "scratch", "mpi"], default="native",
                   help="whose all-reduce: gloo's, ours over gloo, ours over MPI (from --calibrate)")
    p.add_argument("--calibrate", action="store_true", help=f"measure this machine, write --profile ({MEASURED})")
    p.add_argument("--batch-size", type=int, default=8, help="global batch B (split over dp)")
    # the trainer's model flags; --kv-heads not given: the architecture's (gpt2: --heads)
    add_model_flags(p, defaults={"n_kv_heads": None}, helps={"n_kv_heads": "default: gpt2 --heads, else 4"})
    return p


def validate(args, world=1):
    """The first problem with the flags, as one sentence (gpt.options' rules); None if fine."""
    problem = first_problem(*(positive(flag, getattr(args, name)) for flag, name in (
        ("--tp", "tp"), ("--dp", "dp"), ("--batch-size", "batch_size"))),
        divides("--dp", args.dp, args.batch_size, "the batch size"))  # as the trainer splits it
    if problem or args.calibrate:
        return problem
    try:
        config_from_args(args).validate(args.tp)
    except ValueError as e:
        return str(e)
    profile, problem = read_profile(args.profile)
    if profile and args.collectives not in profile["all_reduce"]:
        return (f"--collectives {args.collectives}: profile {profile['name']} has no fit of that all-reduce "
                f"(it has {', '.join(profile['all_reduce'])}); --calibrate fits native and scratch, "
                f"and mpi where mpiexec is installed")
    return problem


def read_profile(name_or_path):
    """(profile or None, problem or None): a preset, a JSON file, or (None given) runs/profile.json
    when it exists; a file that is missing or not JSON is a problem naming it."""
    if name_or_path is None:
        if not Path(MEASURED).exists():
            return None, None
        name_or_path = MEASURED
    if name_or_path in PRESETS:
        return load_profile(name_or_path), None
    data, problem = json_file("--profile", name_or_path)
    if problem:
        return None, problem + f"; run --calibrate, or pass a preset ({', '.join(PRESETS)})"
    if not isinstance(data, dict) or "all_reduce" not in data or "matmul_flops" not in data:
        return None, f"--profile {name_or_path}: not a profile (no all_reduce or matmul_flops); run --calibrate"
    return dict(data, name=str(name_or_path)), None


ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2}
# the architecture's fields that change a count (the norms' epsilon and GeLU's form do not)
COUNTED = ("norm", "position", "mlp", "bias", "key_bias", "tie_embeddings")


def memory_unit(largest):
    """("GiB", 2**30) or ("MiB", 2**20): whichever shows ``largest`` bytes with digits to read."""
    return ("GiB", 2 ** 30) if largest >= 2 ** 30 else ("MiB", 2 ** 20)


def report(args, config, profile, say=print):
    """The planner's tables, as text: parameters, memory and bytes (no profile needed), then,
    with a profile, the predicted step times and the advice."""
    arch, B, itemsize = args.arch, args.batch_size, ITEMSIZE[args.dtype]
    n = parameter_count(config, arch)
    a = architecture(config, arch)
    fields = ", ".join(f"{k}={a[k]}" for k in COUNTED)
    say(f"{arch}: V={config.vocab_size} T={config.seq_len} L={config.n_layers} H={config.hidden} "
        f"nh={config.n_heads} nkv={config.n_kv_heads} F={config.ffn}; {fields}")
    say(f"parameters: {n:,} exactly, {rounded(n)} rounded")
    degrees = sorted({t for t in valid_tp_degrees(config, arch) if t <= 64} | {args.tp})   # --tp even if uneven
    unit, scale = memory_unit(sum(memory_per_rank(config, arch, 1, B // args.dp, args.precision).values()))

    def size(n):
        return f"{n / scale:10.3f}"

    say(f"\nmemory per rank ({unit}, TP rank 0, {args.precision}; activations are Korthikanti et al. 2022's "
        f"formula for 16-bit activations, B={B // args.dp} per rank)")
    if args.dtype != "float32" and args.precision == "fp32":
        say(f"(--dtype {args.dtype} is what the all-reduces carry; this table assumes --precision fp32: "
            f"4-byte weights and gradients; --precision mixed for 2-byte ones with fp32 master weights)")
    say("(AdamW state: m and v, plus the fp32 master weights in mixed precision; total: without SP)")
    say(f"{'t':>3} {'weights':>10} {'grads':>10} {'AdamW':>10} {'act.':>10} {'act.SP':>10} "
        f"{'act.SP+sel':>10} {'total':>10}")
    for t in degrees:
        m = memory_per_rank(config, arch, t, B // args.dp, args.precision)
        sp = activation_bytes(config, B // args.dp, t, sequence_parallel=True)
        sel = activation_bytes(config, B // args.dp, t, sequence_parallel=True, selective=True)
        say(f"{t:>3} {size(m['weights'])} {size(m['gradients'])} {size(m['optimizer'])} "
            f"{size(m['activations'])} {size(sp)} {size(sel)} {size(sum(m.values()))}")
    t = args.tp
    say(f"\ncommunication per step on rank 0, tp={t} dp={args.dp}, {args.dtype} "
        f"(payload: handed to the collective; ring: sent by the ring all-reduce)")
    say(f"{'where':<46} {'group':<5} {'calls':>5} {'payload B':>14} {'ring B':>14}")
    rows = traffic(config, t, B, args.dp, itemsize, arch)
    for r in rows:
        say(f"{r['where']:<46} {r['group']:<5} {r['calls']:>5} {r['payload_bytes']:>14,} {r['ring_bytes']:>14,}")
    say(f"{'total':<46} {'':<5} {sum(r['calls'] for r in rows):>5} "
        f"{sum(r['payload_bytes'] for r in rows):>14,} {sum(r['ring_bytes'] for r in rows):>14,}")
    if profile is None:
        say(f"\nstep times need a profile of the machine: --profile {' or --profile '.join(PRESETS)} "
            f"(vendor-spec presets), or --calibrate to measure this one (writes {MEASURED}, used from then on)")
        return
    report_times(args, config, profile, degrees, say)


def report_times(args, config, profile, degrees, say=print):
    """The predicted step time at every t in ``degrees`` on ``profile``, and where TP stops paying."""
    arch, B, itemsize = args.arch, args.batch_size, ITEMSIZE[args.dtype]
    say(f"\nprofile {profile['name']}: {profile['source']}")
    say(f"{'t':>3} {'GFLOP/rank':>12} {'compute ms':>11} {'elem. ms':>10} {'comm ms':>10} {'overhead ms':>11} "
        f"{'step ms':>10} {'speedup':>8}")
    say("(compute: the matmuls; elem.: norms, activations, softmax, adds, copies, loss, AdamW)")
    base = None
    for d in degrees:
        p = predict_step(config, profile, d, B, args.dp, itemsize, arch, collectives=args.collectives)
        base = base or p["step_s"]
        say(f"{d:>3} {p['flops'] / 1e9:>12.2f} {p['compute_s'] * 1e3:>11.3f} {p['elementwise_s'] * 1e3:>10.3f} "
            f"{p['communication_s'] * 1e3:>10.3f} {p['overhead_s'] * 1e3:>11.3f} {p['step_s'] * 1e3:>10.3f} "
            f"{base / p['step_s']:>7.2f}x")
    cross = crossover_tp(config, profile, B // args.dp, itemsize, arch, args.collectives)
    if cross is None:
        say(f"\nadvice: communication stays below compute up to t={degrees[-1]} on this profile.")
    else:
        say(f"\nadvice: at t={cross} communication ({args.collectives} all-reduce) takes longer than "
            f"compute on this profile; beyond that, TP mostly adds waiting. Use a smaller t "
            f"and add data or pipeline parallelism instead.")


def main(argv=None):
    parser = build_parser()
    args = parse_valid_args(parser, validate, argv, world=1)
    if args.calibrate:
        path = args.profile if args.profile and args.profile not in PRESETS else MEASURED
        profile = calibrate(path)
        print(f"wrote {path}:\n{json.dumps({k: v for k, v in profile.items()}, indent=1)[:2000]}")
        return 0
    report(args, config_from_args(args), read_profile(args.profile)[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
