"""Measure this machine for the inference planner: how fast one process reads weights, what a
decode step costs beyond its arithmetic, and the all-reduce's alpha and beta.

    .venv/bin/python -m tp_from_scratch.inference.planner --calibrate    # writes runs/inference_profile.json

The matmul rate and the all-reduce fits are Lesson 9's (cost.calibrate: measure_matmul_flops,
and its torchrun worker, which times gloo's all-reduce in lockstep between matmuls on 2 and 4
processes); this module adds the two things decoding needs:

    memory_bytes_per_s   a decode step multiplies one token per sequence by every weight: it
                         streams the weights from memory, one multiply-add per number read
    decode_overhead      the interpreter's time per decode step, fixed + per layer, timed on a
                         GPT too small for its weights to matter
"""
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from tp_from_scratch.comm.launchers import run_command, torchrun_command
from tp_from_scratch.cost.calibrate import fit_line, measure_matmul_flops


def _median_time(run, repeats):
    """The median of ``repeats`` timed runs after a warm-up: the statistic gpt.generate bench
    reports (the median step), so that a prediction and its measurement are read alike."""
    run()  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_memory_bandwidth(total_bytes=64 * 2 ** 20, shape=(1024, 1024), repeats=9):
    """Bytes/s one process with one thread reads float32 weights at, as decoding reads them:
    one token (1, in) times each of total_bytes / 4 MiB matrices (out, in) in turn, twice the
    last-level cache of this machine (32 MiB), so every step streams them from memory; the
    median of ``repeats`` passes."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        weights = [torch.randn(shape) for _ in range(total_bytes // (4 * shape[0] * shape[1]))]
        x = torch.randn(1, shape[1])

        def run():
            for w in weights:
                torch.nn.functional.linear(x, w)
        return len(weights) * weights[0].numel() * 4 / _median_time(run, repeats)
    finally:
        torch.set_num_threads(before)


def measure_decode_overhead(depths=(1, 4), steps=16, repeats=7):
    """{"fixed_s", "per_layer_s"}: one decode step's time that is not arithmetic, one thread.

    Times decode steps (one new token against a KV cache, no gradient) of GPTs with H = 16 at
    two depths, the median step over ``repeats`` runs, and fits
    time = fixed + per_layer L: the Python and dispatch of each block's dozen small ops.
    """
    from tp_from_scratch.gpt.generate import generate
    from tp_from_scratch.gpt.model import GPTConfig, init_gpt
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    seconds = []
    try:
        for layers in depths:
            config = GPTConfig(arch="llama", vocab_size=64, seq_len=steps + 4, n_layers=layers, hidden=16,
                               n_heads=4, n_kv_heads=2)
            model = init_gpt(config, 0).eval()
            prompt = torch.zeros(1, 4, dtype=torch.long)
            steps_s = []
            for _ in range(repeats):
                timings = {}
                generate(model, prompt, steps, timings=timings)
                steps_s += timings["decode_s"]
            seconds.append(statistics.median(steps_s))
    finally:
        torch.set_num_threads(before)
    fixed, per_layer = fit_line(list(depths), seconds)
    return {"fixed_s": max(fixed, 0.0), "per_layer_s": max(per_layer, 0.0)}


def fit_all_reduce(p, timeout=300):
    """Lesson 9's lockstep all-reduce fit on p processes (cost.calibrate's torchrun worker):
    {"matmul_flops_concurrent", "native", "scratch"}."""
    with tempfile.TemporaryDirectory() as tmp:
        part = Path(tmp) / "all_reduce.json"
        out = run_command(torchrun_command(p, "tp_from_scratch.cost.calibrate", "--worker", str(part)),
                          timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"the all-reduce calibration on {p} processes failed:\n{out.stdout[-3000:]}")
        return json.loads(part.read_text())


def calibrate(out_path, world_sizes=(2, 4), timeout=300):
    """Measure, write ``out_path`` (JSON) and return the profile the planner's inference mode reads."""
    profile = {"source": "measured here by inference.planner --calibrate", "cores": os.cpu_count(),
               "matmul_flops": {"1": measure_matmul_flops(1)},
               "memory_bytes_per_s": statistics.median(measure_memory_bandwidth() for _ in range(3)),
               "decode_overhead": measure_decode_overhead()}
    for p in world_sizes:
        measured = fit_all_reduce(p, timeout)
        concurrent = measured.pop("matmul_flops_concurrent")
        if p == min(world_sizes):
            profile["matmul_flops_concurrent"], profile["all_reduce"] = concurrent, measured
        profile.setdefault("all_reduce_by_world_size", {})[str(p)] = measured
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(profile, indent=1))
    return profile
