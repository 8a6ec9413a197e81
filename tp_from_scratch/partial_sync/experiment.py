"""The loss-vs-bytes experiment of Lesson 8: how much does partial synchronization cost here?

    .venv/bin/python -m tp_from_scratch.partial_sync.experiment          # the full sweep (about 10 min on 2 cores)
    .venv/bin/python -m tp_from_scratch.partial_sync.experiment --quick  # tp=2, p in {1, 0.5, 0}, one seed, seconds

For tp in {2, 4} and p in {1, 0.75, 0.5, 0.25, 0}, with several seeds (the seed draws the
initial weights; every run sees the same training tokens and is scored on the same held-out
tokens of the Markov chain of tp_from_scratch.gpt.data):

  * bytes per step and step time: a few steps of the CAAT GPT on t simulated ranks (run_spmd, the
    from-scratch ring collectives); bytes are what rank 0's meter counts it sending, every
    TP collective included (embedding, entry f, partial reduces, cross-entropy, the
    replicated gradients' sum);
  * held-out loss: the same model trained on ONE device as its t-stream reference
    (model.t_stream_forward), which tests/test_partial_sync_torch.py proves equal to the TP
    run step for step (float64, 50 AdamW steps); training it there is several times faster on
    2 cores than t threads passing ring messages, and gives the same numbers.

Writes a JSON (default lessons/measurements/partial_sync.json) and a plot of held-out loss
against bytes per step (default lessons/measurements/partial_sync.png).
"""
import argparse
import json
import math
import platform
import statistics
import time
from functools import partial
from pathlib import Path

import torch

from tp_from_scratch.gpt import optim
from tp_from_scratch.gpt.data import entropy_rate, global_batch
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.step import forward_backward, train_step
from tp_from_scratch.partial_sync.mappings import synced_channels
from tp_from_scratch.partial_sync.model import t_stream_forward

DATA_SEED = 0            # the chain and its samples: the same tokens in every run
VALIDATION_STEP = 10**6  # held-out batches are "steps" no run trains on
MEASUREMENTS = Path(__file__).resolve().parents[2] / "lessons" / "measurements"

# controls: (tp, p) trained WITHOUT the sqrt(t) on the private channels, to see what the scaling does
FULL = dict(tps=(2, 4), fractions=(1.0, 0.75, 0.5, 0.25, 0.0), seeds=(0, 1, 2), steps=200,
            config=dict(), batch=8, val_batches=16, timing_steps=4, controls=((4, 0.5), (4, 0.0)))
QUICK = dict(tps=(2,), fractions=(1.0, 0.5, 0.0), seeds=(0,), steps=40,
             config=dict(hidden=32, n_heads=4, n_kv_heads=2, seq_len=16), batch=8, val_batches=4, timing_steps=2)


def validation_loss(gpt, config, t, p, batches, batch_size, scale_private=True):
    """Mean cross-entropy of the t-stream model on the held-out batches."""
    with torch.no_grad():
        losses = [t_stream_forward(gpt, *global_batch(VALIDATION_STEP + i, batch_size, config.seq_len,
                                                       config.vocab_size, DATA_SEED), t, p, scale_private)[1].item()
                  for i in range(batches)]
    return sum(losses) / len(losses)


def train_streams(config, t, p, seed, steps, batch_size, lr=3e-3, scale_private=True):
    """Train the t-stream model from init seed ``seed``; returns (trained GPT, train losses)."""
    gpt = init_gpt(config, seed)
    optimizer = optim.AdamW(gpt.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    streams = partial(forward_backward, loss_fn=lambda gpt, x, y: t_stream_forward(gpt, x, y, t, p, scale_private)[1])
    losses = []
    for step in range(steps):
        x, y = global_batch(step, batch_size, config.seq_len, config.vocab_size, DATA_SEED)
        losses.append(train_step(gpt, optimizer, x, y, run_batch=streams).item())   # Lesson 6's step
    return gpt, losses


def measure_communication(config, t, p, steps, batch_size):
    """(bytes rank 0 sends per step, median step time in s) of the CAAT GPT on t simulated ranks."""
    from tp_from_scratch.comm import run_spmd
    from tp_from_scratch.partial_sync.train import train_on_comm
    argv = ["--tp", str(t), "--sync-fraction", str(p), "--steps", str(steps), "--batch-size", str(batch_size),
            "--hidden", str(config.hidden), "--heads", str(config.n_heads), "--kv-heads", str(config.n_kv_heads),
            "--layers", str(config.n_layers), "--seq-len", str(config.seq_len),
            "--vocab-size", str(config.vocab_size), "--seed", str(DATA_SEED)]
    rank0 = run_spmd(train_on_comm, t, argv, timeout=300)[0]
    sent = set(rank0["bytes_sent"])
    if len(sent) != 1:
        raise RuntimeError(f"tp={t}, p={p}: bytes per step vary between steps: {rank0['bytes_sent']}")
    return sent.pop(), statistics.median(rank0["time_s"][1:] or rank0["time_s"])


def run(plan, log=print):
    """Every run of ``plan``; returns the results dict (also what the JSON holds)."""
    config = GPTConfig(**plan["config"])
    torch.set_num_threads(1)
    results = {"config": config.to_dict(), "steps": plan["steps"], "batch_size": plan["batch"],
               "seeds": list(plan["seeds"]), "tokens_per_run": plan["steps"] * plan["batch"] * config.seq_len,
               "validation_tokens": plan["val_batches"] * plan["batch"] * config.seq_len,
               "entropy_rate": entropy_rate(config.vocab_size, DATA_SEED),
               "data": f"Markov chain of tp_from_scratch.gpt.data (seed {DATA_SEED}), held-out steps "
                       f"{VALIDATION_STEP}..{VALIDATION_STEP + plan['val_batches'] - 1}",
               "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread(s)",
               "rows": [], "curves": {}}
    for t in plan["tps"]:
        for p in plan["fractions"]:
            t0 = time.perf_counter()
            nbytes, step_s = measure_communication(config, t, p, plan["timing_steps"], plan["batch"])
            vals = []
            for seed in plan["seeds"]:
                gpt, losses = train_streams(config, t, p, seed, plan["steps"], plan["batch"])
                vals.append(validation_loss(gpt, config, t, p, plan["val_batches"], plan["batch"]))
                results["curves"][f"tp={t} p={p} seed={seed}"] = [round(v, 5) for v in losses]
            row = {"tp": t, "p": p, "synced_channels": synced_channels(config.hidden, p),
                   "bytes_per_step": nbytes, "step_time_ms": 1000 * step_s,
                   "val_loss_mean": statistics.mean(vals),
                   "val_loss_std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                   "val_losses": vals}
            results["rows"].append(row)
            log(f"tp={t} p={p:<4} k={row['synced_channels']:>3}  bytes/step {nbytes:>10,}  "
                f"step {row['step_time_ms']:6.1f} ms  held-out loss {row['val_loss_mean']:.4f} "
                f"± {row['val_loss_std']:.4f}  ({time.perf_counter() - t0:.0f} s)")
    results["controls"] = []
    for t, p in plan.get("controls", ()):
        vals = [validation_loss(train_streams(config, t, p, seed, plan["steps"], plan["batch"], scale_private=False)[0],
                                config, t, p, plan["val_batches"], plan["batch"], scale_private=False)
                for seed in plan["seeds"]]
        results["controls"].append({"tp": t, "p": p, "scale_private": False, "val_loss_mean": statistics.mean(vals),
                                    "val_loss_std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                                    "val_losses": vals})
        log(f"control, no sqrt(t): tp={t} p={p:<4} held-out loss {results['controls'][-1]['val_loss_mean']:.4f} "
            f"± {results['controls'][-1]['val_loss_std']:.4f}")
    for row in results["rows"]:
        full = next(r for r in results["rows"] if r["tp"] == row["tp"] and r["p"] == 1.0)
        row["bytes_relative"] = row["bytes_per_step"] / full["bytes_per_step"]
    return results


def plot(results, path):
    """Held-out loss (mean ± std over seeds) against bytes per step, one line per tp."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for t in sorted({r["tp"] for r in results["rows"]}):
        rows = sorted((r for r in results["rows"] if r["tp"] == t), key=lambda r: r["bytes_per_step"])
        ax.errorbar([r["bytes_per_step"] / 2**20 for r in rows], [r["val_loss_mean"] for r in rows],
                    yerr=[r["val_loss_std"] for r in rows], marker="o", capsize=3, label=f"tp={t}")
        for r in rows:
            ax.annotate(f"p={r['p']:g}", (r["bytes_per_step"] / 2**20, r["val_loss_mean"]),
                        textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.axhline(results["entropy_rate"], color="gray", linestyle=":", label="entropy rate (best possible)")
    ax.set_xlabel("TP bytes sent per step by rank 0 (MiB)")
    ax.set_ylabel("held-out loss (mean ± std over seeds)")
    ax.set_title(f"Partial synchronization: {results['steps']} steps, {len(results['seeds'])} seed(s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def table(results):
    """The experiment's rows as a markdown table (docs/measured.md, lesson); ± is the standard deviation
    over the seeds. The step times stay in the JSON: on a shared 2-core machine they are noise."""
    lines = ["| tp | p | bytes/step vs p=1 | held-out loss ± std over seeds |",
             "|---|---|---|---|"]
    for r in results["rows"]:
        lines.append(f"| {r['tp']} | {r['p']:g} | {r['bytes_relative']:.2f} | "
                     f"{r['val_loss_mean']:.4f} ± {r['val_loss_std']:.4f} |")
    for c in results.get("controls", ()):
        lines.append(f"| {c['tp']} | {c['p']:g}, no sqrt(t) (control) | | "
                     f"{c['val_loss_mean']:.4f} ± {c['val_loss_std']:.4f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tp_from_scratch.partial_sync.experiment",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tp=2, p in {1, 0.5, 0}, one seed, 40 steps")
    parser.add_argument("--out", metavar="JSON", help="default lessons/measurements/partial_sync[_quick].json")
    parser.add_argument("--plot", metavar="PNG", help="default: the JSON's path with .png")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    out = Path(args.out) if args.out else MEASUREMENTS / ("partial_sync_quick.json" if args.quick else "partial_sync.json")
    t0, cpu0 = time.perf_counter(), time.process_time()
    results = run(plan)
    results["command"] = ".venv/bin/python -m tp_from_scratch.partial_sync.experiment" + (" --quick" if args.quick else "")
    # on a shared machine the wall time includes other people's work; the CPU time does not
    results["wall_s"] = round(time.perf_counter() - t0, 1)
    results["cpu_s"] = round(time.process_time() - cpu0, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    png = plot(results, args.plot or out.with_suffix(".png"))
    print(table(results))
    print(f"{results['wall_s']:.0f} s ({results['cpu_s']:.0f} s of CPU); results: {out}; plot: {png}")
    if not math.isfinite(sum(r["val_loss_mean"] for r in results["rows"])):
        raise SystemExit("a run diverged (non-finite loss)")


if __name__ == "__main__":
    main()
