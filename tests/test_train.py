"""Training under torchrun equals single-device training, step by step, at every dp x tp.

Each launch trains the default tiny GPT for 50 steps and writes its losses (--metrics).
The reference is computed here, at test time, by the single-device GPT on the same
global batches (tests/single_device.py), and every step's loss is compared through
compare.assert_matches_reference under the per-dtype tolerance.

The launches are shared between tests through the ``runs`` fixture (each configuration
runs once per session): that keeps this file to about a dozen torchrun launches.
"""
import json
import threading
from functools import lru_cache

import numpy as np
import pytest

from tp_from_scratch.gpt import checkpoint as ckpt
from single_device import layers_of, lr_of, single_device_losses, single_device_weights
from tp_from_scratch.gpt import train
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.comm.launchers import free_port, run_command, torchrun_command

STEPS = 50
LAUNCH_TIMEOUT = 240

# name -> (processes, extra arguments). The dp=2 x tp=2 float64 run is the two-node rehearsal.
RUNS = {
    "tp2-f32": (2, ["--tp", "2", "--dtype", "float32", "--save", "{dir}/ckpt", "--save-every", "25"]),
    "tp4-f32": (4, ["--tp", "4", "--dtype", "float32"]),
    # the TP groups on the from-scratch ring (a TorchComm over each TP process group)
    "dp2tp2-f32": (4, ["--tp", "2", "--dtype", "float32", "--collectives", "scratch"]),
    "tp4-f64": (4, ["--tp", "4", "--dtype", "float64", "--save", "{dir}/ckpt-tp4-f64"]),
    "dtensor-tp2-f32": (2, ["--tp", "2", "--dtype", "float32", "--impl", "dtensor"]),
}


def read_losses(path):
    with open(path) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f)}


def launch(nproc, args, tmp, name, nnodes=1):
    """Run train under torchrun (on ``nnodes`` simulated nodes) and return {step: loss}."""
    metrics = tmp / f"{name}.jsonl"
    argv = [a.replace("{dir}", str(tmp)) for a in args] + ["--metrics", metrics, "--no-progress"]
    if nnodes == 1:
        out = run_command(torchrun_command(nproc, "tp_from_scratch.gpt.train", *argv), timeout=LAUNCH_TIMEOUT)
        assert out.returncode == 0, f"{name} failed:\n{out.stdout[-4000:]}"
    else:
        port, results = free_port(), [None] * nnodes

        def node(i):   # one torchrun launcher per "node", meeting at 127.0.0.1:port
            cmd = torchrun_command(nproc // nnodes, "tp_from_scratch.gpt.train", *argv,
                                   nnodes=nnodes, node_rank=i, port=port)
            results[i] = run_command(cmd, timeout=LAUNCH_TIMEOUT)

        threads = [threading.Thread(target=node, args=(i,)) for i in range(nnodes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(LAUNCH_TIMEOUT + 10)
        for i, out in enumerate(results):
            assert out is not None and out.returncode == 0, f"{name} node {i} failed:\n{out and out.stdout[-4000:]}"
    return read_losses(metrics)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """runs(name) -> {step: loss} of that configuration, launched on first use."""
    tmp = tmp_path_factory.mktemp("train")
    cache = {}

    def get(name):
        if name not in cache:
            nproc, args = RUNS[name]
            cache[name] = launch(nproc, args + ["--steps", str(STEPS)], tmp, name)
        return cache[name]

    get.dir = tmp
    return get


@lru_cache(maxsize=None)
def reference(dtype, *extra):
    """Single-device losses, computed here in the test process."""
    return single_device_losses(["--dtype", dtype, "--steps", str(STEPS), *extra])


def assert_losses_match(losses, ref, what, dtype, first=0, exact=False):
    """Every step's loss against the reference, in the run's dtype (JSON keeps float32 exactly).

    The loss of step k is held to the policy's bound after k steps through the default depth."""
    assert sorted(losses) == list(range(first, first + len(ref))), f"{what}: steps {sorted(losses)}"
    for i, r in enumerate(ref):
        step = first + i
        got, expected = np.asarray(losses[step], dtype), np.asarray(float(r), dtype)
        assert_matches_reference(got, expected, name=f"{what}: loss at step {step}", exact=exact,
                                 tol=tolerance(dtype, layers=layers_of([]), steps=step))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["tp2-f32", "tp4-f32", "dp2tp2-f32", "tp4-f64"])  # float64 at tp=2: the two-node run
def test_losses_equal_single_device(runs, name):
    # 50 steps at tp=2, tp=4 and dp=2 x tp=2, float32 and float64: every step's loss must
    # equal the single-device loss under the per-dtype tolerance (near-bitwise in float64)
    dtype = "float64" if name.endswith("f64") else "float32"
    assert_losses_match(runs(name), reference(dtype), name, dtype)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_nodes_dp2_tp2_float64_sgd(tmp_path):
    # two torchrun launchers, --nnodes 2 --node-rank 0/1, rendezvous on 127.0.0.1:free port:
    # each "node" holds one TP group (tp=2), data parallelism runs across the nodes.
    # SGD here, not AdamW: Adam's step ignores a gradient's scale, so only SGD sees a DP
    # all-reduce that sums the gradients instead of averaging them
    sgd = ("--optimizer", "sgd")
    losses = launch(4, ["--tp", "2", "--dtype", "float64", "--steps", str(STEPS), *sgd, "--save",
                        str(tmp_path / "ckpt")], tmp_path, "two-nodes", nnodes=2)
    assert_losses_match(losses, reference("float64", *sgd), "dp=2 x tp=2 on two nodes", "float64")
    # the trained weights, glued back into one state dict, equal single-device training's
    expected = single_device_weights(["--dtype", "float64", "--steps", str(STEPS), *sgd])
    got = ckpt.load_full(tmp_path / "ckpt")["model"]
    assert set(got) == set(expected)
    # SGD's step adds lr x the gradient's error (lr < 1): the plain growth rule after STEPS steps
    bound = tolerance("float64", layers=layers_of([]), steps=STEPS)
    for name, value in expected.items():
        assert_matches_reference(got[name], value, name=f"trained {name}", tol=bound)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_trained_weights_adamw_float64_equal_single_device(runs):
    # after 50 AdamW steps at tp=4, the gathered weights equal single-device training's.
    # float64 on purpose: Adam divides by sqrt(v) + eps, so a weight whose gradient is nearly
    # zero turns the gradient's roundoff into a weight error up to lr / eps times larger
    # (compare.py's growth rule); in float32 that bound would be useless, so float32 training
    # is compared by its losses (tested above).
    runs("tp4-f64")
    expected = single_device_weights(["--dtype", "float64", "--steps", str(STEPS)])
    got = ckpt.load_full(runs.dir / "ckpt-tp4-f64")["model"]
    assert set(got) == set(expected)
    bound = tolerance("float64", layers=layers_of([]), steps=STEPS, adamw_lr=lr_of([]))
    for name, value in expected.items():
        assert_matches_reference(got[name], value, name=f"trained {name} (tp=4, AdamW, float64)", tol=bound)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dtensor_equals_scratch(runs):
    # PyTorch's own TP (DTensor) from the same weights: the same losses as ours, and as one device
    dtensor, scratch = runs("dtensor-tp2-f32"), runs("tp2-f32")
    assert_losses_match(dtensor, [scratch[s] for s in sorted(scratch)], "dtensor against scratch", "float32")
    assert_losses_match(dtensor, reference("float32"), "dtensor against single device", "float32")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_resume_same_and_other_tp(runs, tmp_path):
    # the tp=2 run saved at step 25 (--save-every 25) on its way to 50
    uninterrupted = runs("tp2-f32")
    meta = [ckpt.read_metadata(d)[1] for d in runs.dir.glob("ckpt/step_*")]
    at25 = next(d for d in runs.dir.glob("ckpt/step_00000025-*"))
    assert sorted(m["step"] for m in meta) == [25, 50]
    # 1) resumed at the same tp: steps 25..49 bitwise equal to the uninterrupted run. Another
    #    process, the same bits: runs are deterministic, and the checkpoint lost nothing
    #    (weights, both AdamW moments and its step count)
    same = launch(2, ["--tp", "2", "--steps", str(STEPS), "--load", str(at25)], tmp_path, "same")
    assert_losses_match(same, [uninterrupted[s] for s in range(25, STEPS)], "resumed at tp=2",
                        "float32", first=25, exact=True)
    # 2) resumed at tp=4 (resharded weights and AdamW moments): equal within the tolerance
    other = launch(4, ["--tp", "4", "--steps", str(STEPS), "--load", str(at25)], tmp_path, "other")
    assert_losses_match(other, [uninterrupted[s] for s in range(25, STEPS)], "resumed at tp=4",
                        "float32", first=25)
    assert_losses_match(other, reference("float32")[25:], "resumed at tp=4 vs single device",
                        "float32", first=25)
