"""Predicted against measured decode latency of gpt.generate at t = 1, 2, 4 on this machine.

    .venv/bin/python -m tp_from_scratch.inference.benchmark                    # calibrates first if needed
    .venv/bin/python -m tp_from_scratch.inference.benchmark --out lessons/measurements/decode_latency.json

A benchmark, not a test: it prints the two side by side with their ratio, and asserts nothing.
It runs Lesson 6's latency bench (``gpt.generate bench``: a random Llama-style model, greedy
decoding, the median per-token decode time) with python at t = 1 and torchrun at t = 2 and 4,
one BLAS thread per rank, and predicts each with latency.decode_step on the profile that
planner --calibrate measured here (runs/inference_profile.json; made first when missing).
t = 4 puts four processes on this machine's cores: oversubscribed when it has fewer.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tp_from_scratch.comm.launchers import run_command, subprocess_env, torchrun_command
from tp_from_scratch.gpt.model import GPTConfig
from tp_from_scratch.inference.calibrate import calibrate
from tp_from_scratch.inference.latency import MEASURED, decode_step, load_profile, prefill

# Lesson 6's latency bench (lessons/measurements/remeasure/06_generate_latency.sh), as it runs it
BENCH = dict(arch="llama", layers=4, hidden=512, heads=8, kv_heads=4, vocab_size=4096, batch_size=1,
             prompt_len=64, new_tokens=32, repeats=5)
TARGET = 0.25  # predicted within +-25 % of measured


def bench_args(json_path):
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in BENCH.items() if k != "arch"]
    return ["bench", f"--arch={BENCH['arch']}", *flags, f"--json={json_path}"]


def measure(degrees=(1, 2, 4), timeout=300):
    """[the JSON line gpt.generate bench writes] for each t: prefill_ms, decode_ms_per_token, ..."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.jsonl"
        for t in degrees:
            cmd = ([sys.executable, "-m", "tp_from_scratch.gpt.generate"] if t == 1 else
                   torchrun_command(t, "tp_from_scratch.gpt.generate"))
            done = run_command([*cmd, *bench_args(out)], timeout=timeout, env=subprocess_env())
            if done.returncode != 0:
                raise RuntimeError(f"gpt.generate bench at t={t} failed:\n{done.stdout[-2000:]}")
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    return rows


def config_of(row):
    """The GPTConfig gpt.generate bench built for this row."""
    return GPTConfig(arch=row["arch"], vocab_size=BENCH["vocab_size"], seq_len=row["prompt"] + row["new_tokens"],
                     n_layers=row["layers"], hidden=row["hidden"], n_heads=row["heads"], n_kv_heads=row["kv_heads"])


def predict(row, profile):
    """(decode step, prefill) predictions for a measured row: greedy, float32, the gathered
    logits, the median step's context (the prompt and half the new tokens)."""
    config, t, itemsize = config_of(row), row["tp"], 4
    context = row["prompt"] + row["new_tokens"] // 2
    return (decode_step(config, profile, t, row["batch"], context, itemsize),
            prefill(config, profile, t, row["batch"], row["prompt"], itemsize))


def report(rows, profile, say=print):
    say(f"profile {profile['name']}: memory {profile['memory_bytes_per_s'] / 1e9:.1f} GB/s, decode overhead "
        f"{profile['decode_overhead']['fixed_s'] * 1e3:.2f} ms + {profile['decode_overhead']['per_layer_s'] * 1e3:.2f} "
        f"ms/layer, all-reduce alpha {profile['all_reduce']['native']['alpha_s'] * 1e6:.0f} us/message (t=2)")
    say(f"{'t':>3} {'decode ms measured':>19} {'predicted':>10} {'ratio':>6}  {'read':>6} {'AR':>6} {'gather':>6} "
        f"{'ovh':>6} | {'prefill ms measured':>20} {'predicted':>10} {'ratio':>6}")
    ratios = []
    for row in rows:
        d, p = predict(row, profile)
        ratio = d["step_s"] * 1e3 / row["decode_ms_per_token"]
        ratios.append(ratio)
        say(f"{row['tp']:>3} {row['decode_ms_per_token']:>19.2f} {d['step_s'] * 1e3:>10.2f} {ratio:>6.2f}  "
            f"{max(d['memory_s'], d['compute_s']) * 1e3:>6.2f} {d['all_reduce_s'] * 1e3:>6.2f} "
            f"{d['sampling_s'] * 1e3:>6.2f} {d['overhead_s'] * 1e3:>6.2f} | {row['prefill_ms']:>20.2f} "
            f"{p['step_s'] * 1e3:>10.2f} {p['step_s'] * 1e3 / row['prefill_ms']:>6.2f}")
    inside = sum(abs(r - 1) <= TARGET for r in ratios)
    say(f"{inside} of {len(ratios)} decode predictions within +-{TARGET:.0%} of measured "
        f"(ratios {min(ratios):.2f} to {max(ratios):.2f}); prefill is not a target (its element-wise work is not priced)")
    return ratios


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tp_from_scratch.inference.benchmark", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default=MEASURED, help=f"a profile from planner --calibrate (default {MEASURED})")
    parser.add_argument("--calibrate", action="store_true", help="measure the profile again first")
    parser.add_argument("--out", help="write the profile, the measurements and the load average here (JSON)")
    args = parser.parse_args(argv)
    if args.calibrate or not Path(args.profile).exists():
        calibrate(args.profile)
    rows = measure()
    profile = load_profile(args.profile)
    ratios = report(rows, profile)
    if args.out:
        command = " ".join([".venv/bin/python -m tp_from_scratch.inference.benchmark",
                            *(["--calibrate"] if args.calibrate else []), f"--out {args.out}"])
        record = {"command": command, "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
                  "cores": os.cpu_count(), "load_average": os.getloadavg(), "profile": profile,
                  "rows": rows, "ratios": ratios, "median_ratio": statistics.median(ratios)}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
