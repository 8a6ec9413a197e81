"""Lesson 14's experiment on real text: perplexity against bytes per token against modelled decode
latency, for plain TP, Sync-Point Drop, quantized all-reduce and CAAT-Net, on one model trained here.

    .venv/bin/python -m tp_from_scratch.inference.experiment            # a few minutes on 2 cores
    .venv/bin/python -m tp_from_scratch.inference.experiment --quick    # seconds: a smoke run, not a result

The text is bytes of the Python standard library's source (gpt/text.py, V = 256: the tokens are
bytes); every model is the course's GPT (LayerNorm, learned positions: the architecture of
Lesson 8's CAAT-Net streams), trained on ONE device by Lesson 6's train_step, and scored on the
held-out split at TP degree t = 4 through the single-device emulations that the tests prove equal
to the TP models (float64; this script runs float32 for speed):

  * plain TP, and the post-training techniques on that same trained model, no retraining:
    Sync-Point Drop on k = 1 .. L blocks in the paper's back-to-front sensitivity order (its
    zero-shot step only: no distillation, no head grouping), the sensitivities measured on
    training batches (models.sensitivity_order), perplexity on held-out ones
    (emulation.partitioned_forward); quantized all-reduce (two-step and all-gather) at bits x
    group size (quantized.reference_reduce);
  * CAAT-Net at p < 1: a model trained from scratch with partial synchronization (Lesson 8's
    t-stream reference, partial_sync.model.t_stream_forward), the same steps and tokens.

Per setting: held-out perplexity exp(mean cross-entropy in nats per byte); the bytes rank 0 sends
per generated token (models.forward_bytes at B = 1, messages in bfloat16, logits left sharded:
the tests check that formula against the meter); and the modelled decode step of this model
(latency.decode_step at B = 1, the context half the sequence) on this CPU's profile (the one
lessons/measurements/decode_latency.json holds), NVLink and PCIe. Writes a JSON (default
lessons/measurements/tp_inference_text.json) that Lesson 14 reads and plots (``plot``).
"""
import argparse
import hashlib
import json
import math
import sys
import time
from functools import partial
from pathlib import Path

import torch
from torch.nn import functional as F

from tp_from_scratch.gpt import optim
from tp_from_scratch.gpt.data import global_batch
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.step import forward_backward, train_step
from tp_from_scratch.gpt.text import VOCAB_SIZE, corpus
from tp_from_scratch.inference.emulation import partitioned_forward
from tp_from_scratch.inference.latency import decode_step, load_profile
from tp_from_scratch.inference.models import forward_bytes, sensitivity_order
from tp_from_scratch.inference.quantized import reference_reduce
from tp_from_scratch.partial_sync.model import t_stream_forward

MEASUREMENTS = Path(__file__).resolve().parents[2] / "lessons" / "measurements"
CPU_PROFILE = MEASUREMENTS / "decode_latency.json"   # this machine's profile, from the decode benchmark
DATA_SEED = 0
VALIDATION_STEP = 10 ** 6                            # held-out batches: steps no run trains on
ITEMSIZE = 2                                         # bytes per message element: bfloat16, as served

FULL = dict(config=dict(vocab_size=VOCAB_SIZE, seq_len=64, n_layers=4, hidden=64, n_heads=8, n_kv_heads=4,
                        ffn=256, arch="gpt"),
            t=4, steps=300, batch=16, lr=3e-3, val_batches=16, calibration_batches=4,
            bits=(8, 6, 4, 3, 2), groups=(16, 128), fractions=(0.5, 0.25))
QUICK = dict(FULL, steps=20, batch=4, val_batches=2, calibration_batches=1, bits=(8, 4), groups=(16,),
             fractions=(0.5,))


def batches(plan, config, first, count, split):
    return [global_batch(first + i, plan["batch"], config.seq_len, VOCAB_SIZE, DATA_SEED, "text", split)
            for i in range(count)]


def train(config, plan, t=1, p=1.0, seed=0):
    """A GPT trained on the text's training split: ordinary (p = 1), or CAAT-Net's t streams."""
    torch.manual_seed(seed)
    gpt = init_gpt(config, seed)
    optimizer = optim.AdamW(gpt.parameters(), lr=plan["lr"], betas=(0.9, 0.95), weight_decay=0.0)
    run_batch = forward_backward
    if p < 1.0:
        run_batch = partial(forward_backward, loss_fn=lambda g, x, y: t_stream_forward(g, x, y, t, p)[1])
    for step in range(plan["steps"]):
        x, y = global_batch(step, plan["batch"], config.seq_len, VOCAB_SIZE, DATA_SEED, "text", "train")
        train_step(gpt, optimizer, x, y, run_batch=run_batch)
    return gpt.eval()


def mean_loss(logits_of, data):
    """Mean cross-entropy (nats per byte) of ``logits_of(x)`` over the (x, y) batches."""
    with torch.no_grad():
        losses = [F.cross_entropy(logits_of(x).flatten(0, 1), y.flatten()).item() for x, y in data]
    return sum(losses) / len(losses)


def decode_ms(config, profiles, t, **syncs):
    """{profile: modelled decode step in ms} of this model at B = 1, the context half a sequence."""
    return {name: 1e3 * decode_step(config, profile, t, 1, config.seq_len // 2, ITEMSIZE, **syncs)["step_s"]
            for name, profile in profiles.items()}


def profiles():
    cpu = dict(json.loads(CPU_PROFILE.read_text())["profile"], name="this CPU")
    return {"this CPU": cpu, "NVLink": load_profile("h100-nvlink"), "PCIe": load_profile("h100-pcie")}


def run(plan, log=print):
    """Every setting of ``plan``: the results dict the JSON holds."""
    torch.set_num_threads(1)
    config, t = GPTConfig(**plan["config"]), plan["t"]
    held_out = batches(plan, config, VALIDATION_STEP, plan["val_batches"], "val")
    calibration = batches(plan, config, VALIDATION_STEP, plan["calibration_batches"], "train")
    prices = profiles()
    rows = []

    def add(technique, setting, loss, syncs, bytes_kw):
        row = {"technique": technique, "setting": setting, "loss": loss, "perplexity": math.exp(loss),
               "bytes_per_token": forward_bytes(config, t, 0, 1, ITEMSIZE, **bytes_kw),
               "decode_ms": decode_ms(config, prices, t, **syncs)}
        rows.append(row)
        log(f"{technique:<12} {setting:<22} perplexity {row['perplexity']:7.4f}  bytes/token "
            f"{row['bytes_per_token']:>6,}  decode ms " + ", ".join(f"{k} {v:.3f}" for k, v in row["decode_ms"].items()))

    start = time.perf_counter()
    gpt = train(config, plan)
    log(f"trained the plain model: {plan['steps']} steps ({time.perf_counter() - start:.0f} s)")
    single = mean_loss(lambda x: gpt(x)[0], held_out)
    add("plain TP", f"t={t}", mean_loss(lambda x: partitioned_forward(gpt, x, t), held_out), {}, {})

    order, sensitivity = sensitivity_order(
        lambda blocks: mean_loss(lambda x: partitioned_forward(gpt, x, t, blocks), calibration), config.n_layers)
    for k in range(1, config.n_layers + 1):
        blocks = tuple(sorted(order[:k]))
        add("SPD", f"{k} of {config.n_layers} blocks {blocks}",
            mean_loss(lambda x, b=blocks: partitioned_forward(gpt, x, t, b), held_out),
            {"spd_blocks": k}, {"spd_blocks": blocks})

    for scheme in ("two_step", "all_gather"):
        for bits in plan["bits"]:
            for group in plan["groups"]:
                reduce = reference_reduce(bits, group, scheme)
                options = {"bits": bits, "group_size": group, "scheme": scheme}
                add(f"quantized {scheme.replace('_', '-')}", f"{bits} bits, groups of {group}",
                    mean_loss(lambda x, r=reduce: partitioned_forward(gpt, x, t, (), r), held_out), options, options)

    for p in plan["fractions"]:
        start = time.perf_counter()
        caat = train(config, plan, t, p)
        log(f"trained CAAT-Net p={p}: {plan['steps']} steps ({time.perf_counter() - start:.0f} s)")
        add("CAAT-Net", f"p={p}", mean_loss(lambda x, g=caat: t_stream_forward(g, x, None, t, p)[0], held_out),
            {"synced_fraction": p}, {"synced_fraction": p})

    _, digest = corpus()
    return {"config": config.to_dict(), "t": t, "steps": plan["steps"], "batch_size": plan["batch"],
            "lr": plan["lr"], "validation_tokens": plan["val_batches"] * plan["batch"] * config.seq_len,
            "data": f"bytes of the Python standard library's source (gpt/text.py), sha256 {digest[:16]}",
            "single_device_loss": single, "sensitivity": {str(b): s for b, s in sensitivity.items()},
            "sensitivity_order": order, "message_itemsize": ITEMSIZE,
            "profiles": {name: prof.get("source", "") for name, prof in prices.items()},
            "cpu_profile_sha": hashlib.sha256(CPU_PROFILE.read_bytes()).hexdigest()[:16], "rows": rows}


def pareto(rows, key):
    """The rows no other row beats on both ``key(row)`` and perplexity (lower is better)."""
    return [r for r in rows if not any(key(o) <= key(r) and o["perplexity"] <= r["perplexity"] and
                                       (key(o), o["perplexity"]) != (key(r), r["perplexity"]) for o in rows)]


MARKERS = {"plain TP": ("k", "*"), "SPD": ("tab:red", "o"), "quantized two-step": ("tab:blue", "s"),
           "quantized all-gather": ("tab:cyan", "D"), "CAAT-Net": ("tab:green", "^")}


def plot(results, axes):
    """Perplexity against bytes per token and against the modelled decode step on each profile,
    one panel each (``axes``: 1 + number of profiles), the Pareto frontier dashed."""
    rows = results["rows"]
    xs = [("bytes rank 0 sends per token", lambda r: r["bytes_per_token"])]
    xs += [(f"modelled decode step, {name} (ms)", lambda r, n=name: r["decode_ms"][n]) for name in results["profiles"]]
    for ax, (label, key) in zip(axes, xs):
        for technique, (color, marker) in MARKERS.items():
            mine = [r for r in rows if r["technique"] == technique]
            ax.scatter([key(r) for r in mine], [r["perplexity"] for r in mine], c=color, marker=marker,
                       label=technique, s=28)
        front = sorted(pareto(rows, key), key=key)
        ax.plot([key(r) for r in front], [r["perplexity"] for r in front], "k--", lw=0.8)
        ax.set_xlabel(label)
    axes[0].set_ylabel("held-out perplexity (per byte)")
    axes[0].legend(fontsize=7)
    return axes


def table(results):
    """The rows as text, one per setting."""
    names = list(results["profiles"])
    lines = [f"{'technique':<21} {'setting':<24} {'perplexity':>10} {'bytes/token':>11} "
             + " ".join(f"{n + ' ms':>12}" for n in names)]
    for r in results["rows"]:
        lines.append(f"{r['technique']:<21} {r['setting']:<24} {r['perplexity']:>10.4f} {r['bytes_per_token']:>11,} "
                     + " ".join(f"{r['decode_ms'][n]:>12.3f}" for n in names))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tp_from_scratch.inference.experiment", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20 steps, fewer settings: a smoke run")
    parser.add_argument("--out", metavar="JSON", help="default lessons/measurements/tp_inference_text.json (--quick: runs/tp_inference_text_quick.json)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    out = Path(args.out or ("runs/tp_inference_text_quick.json" if args.quick else MEASUREMENTS / "tp_inference_text.json"))
    results = run(plan)
    results["command"] = ".venv/bin/python -m tp_from_scratch.inference.experiment" + (" --quick" if args.quick else "")
    results["date"] = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(table(results))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
