"""Training under torchrun equals single-device training, step by step, at every dp x tp.

Every configuration trains the default tiny GPT for 10 steps (50 in `make test-slow`,
TP_TEST_SLOW=1) and writes its losses (--metrics).
The reference is computed here, at test time, by the single-device GPT on the same
global batches (tests/single_device.py), and every step's loss is compared through
compare.assert_matches_reference under the per-dtype tolerance.

The runs on 4 processes share ONE launch (tests/spmd_scripts/gpt_training.py: tp=4 and
dp=2 x tp=2 meshes of the same processes, eight runs, resumes included), made once per module by
the ``runs`` fixture as a two-node rehearsal: two torchrun launchers (--nnodes 2, --node-rank 0
and 1) of 2 processes each, meeting at 127.0.0.1 on a free port, each node one TP group of the
dp=2 x tp=2 mesh, data parallelism across the nodes. The 2-process,
dp=1 trainer is launched by tests/test_trainer_options.py. The dp=2 x tp=2 run on the
from-scratch ring also has its printed bytes held to Lesson 9's traffic model here. `make test` trains 10 steps: every
claim here holds from the first step on (each step's loss against one device, the resume
half-way, the trained weights); `make test-slow` runs this file, and Lesson 7's launch
(tests/test_sp_training_torchrun.py: tp=4, and dp=2 x tp=2 saved, then loaded by this file's
trainer at tp=4), at 50 steps.
"""
import json
import re
import threading
from functools import lru_cache

import numpy as np
import pytest

from tests.slow import SLOW
from tp_from_scratch.cost import model as cost
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import train
from single_device import layers_of, lr_of, single_device_losses, single_device_weights
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.comm.launchers import free_port, run_command, torchrun_command

STEPS = 50 if SLOW else 10
HALF = STEPS // 2   # the dp=2 x tp=2 run saves here on its way, and two runs resume from it
LAUNCH_TIMEOUT = 240


def read_losses(path):
    with open(path) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f)}


def launch_two_nodes(module, *args, timeout=LAUNCH_TIMEOUT):
    """Run ``module`` under two torchrun launchers (two simulated nodes of 2 processes each);
    return each node's output, node 0's (ranks 0 and 1) first."""
    port, results = free_port(), [None] * 2

    def node(i):   # one torchrun launcher per "node", meeting at 127.0.0.1:port
        cmd = torchrun_command(2, module, *args, nnodes=2, node_rank=i, port=port)
        results[i] = run_command(cmd, timeout=timeout)

    threads = [threading.Thread(target=node, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    for i, out in enumerate(results):
        assert out is not None and out.returncode == 0, f"node {i} failed:\n{out and out.stdout[-4000:]}"
    return [out.stdout for out in results]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """runs(name) -> {step: loss} of that run of tests/spmd_scripts/gpt_training.py (one two-node launch)."""
    tmp = tmp_path_factory.mktemp("train")
    node0, _ = launch_two_nodes("tests.spmd_scripts.gpt_training", tmp, STEPS, timeout=540)

    def get(name):
        return read_losses(tmp / f"{name}.jsonl")

    get.dir, get.stdout = tmp, node0   # rank 0 prints on node 0
    return get


def printed_by(stdout, name):
    """What rank 0 printed during the launch's run ``name`` (the script prints "ran <name>" after each)."""
    lines = stdout.splitlines()
    end = lines.index(f"ran {name}")
    start = max((i for i in range(end) if lines[i].startswith("ran ")), default=-1) + 1
    return "\n".join(lines[start:end])


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
# float64 at dp=2 x tp=2: the two-node run
@pytest.mark.parametrize("name", ["dp2tp2-f32", "tp4-f32", "dp2tp2-scratch-f32", "tp4-f64"])
def test_losses_equal_single_device(runs, name):
    # STEPS steps at tp=4 and dp=2 x tp=2, float32 and float64: every step's loss must
    # equal the single-device loss under the per-dtype tolerance (near-bitwise in float64)
    dtype = "float64" if name.endswith("f64") else "float32"
    assert_losses_match(runs(name), reference(dtype), name, dtype)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_nodes_dp2_tp2_float64_sgd(runs):
    # the runs fixture's launch is two torchrun launchers, --nnodes 2 --node-rank 0/1, meeting
    # at 127.0.0.1:free port: each "node" holds one TP group (tp=2), data parallelism runs across
    # the nodes. SGD, not AdamW: why, at the run in tests/spmd_scripts/gpt_training.py
    sgd = ("--optimizer", "sgd")
    losses = runs("dp2tp2-sgd-f64")
    assert_losses_match(losses, reference("float64", *sgd), "dp=2 x tp=2 on two nodes", "float64")
    # the trained weights, glued back into one state dict, equal single-device training's
    expected = single_device_weights(["--dtype", "float64", "--steps", str(STEPS), *sgd])
    got = ckpt.load_full(runs.dir / "ckpt-sgd")["model"]
    assert set(got) == set(expected)
    # SGD's step adds lr x the gradient's error (lr < 1): the plain growth rule after STEPS steps
    bound = tolerance("float64", layers=layers_of([]), steps=STEPS)
    for name, value in expected.items():
        assert_matches_reference(got[name], value, name=f"trained {name}", tol=bound)


def table_rows(text, header):
    """The whitespace-separated rows of the text table that starts at the line ``header`` begins."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 1:]:
        if not line.strip() or not re.match(r"^[\w(-]", line):
            break
        if not line.startswith("-"):
            rows.append(line.split())
    return rows


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dp2_tp2_trainer_reports_the_predicted_bytes(runs):
    # Lesson 9's traffic model against what the trainer prints, two meters of one run:
    # torch.distributed's dp all-reduces (payload per step, CollectiveCounter) and the
    # from-scratch ring of the tp group (the TorchComm's meter, totals over the steps)
    printed = printed_by(runs.stdout, "dp2tp2-scratch-f32")
    args = train.parse(["--tp", "2", "--steps", str(STEPS), "--dtype", "float32", "--collectives", "scratch"])
    rows = cost.traffic(args.model, 2, args.batch_size, dp=2, itemsize=4)
    dp = [r for r in rows if r["group"] == "dp"]
    tp = [r for r in rows if r["group"] == "tp"]
    counted = {(r[0], r[1]): r for r in table_rows(printed, "collective               group")}
    assert float(counted["all_reduce", "dp"][2]) == sum(r["calls"] for r in dp)
    assert int(counted["all_reduce", "dp"][3].replace(",", "")) == sum(r["payload_bytes"] for r in dp)
    ring = {r[0]: r for r in table_rows(printed, "collective  calls")}
    assert int(ring["all_reduce"][1]) == STEPS * sum(r["calls"] for r in tp)
    assert int(ring["all_reduce"][3]) == STEPS * sum(r["ring_bytes"] for r in tp)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_trained_weights_adamw_float64_equal_single_device(runs):
    # after STEPS AdamW steps at tp=4, the gathered weights equal single-device training's.
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
    dtensor, scratch = runs("dtensor-dp2tp2-f32"), runs("dp2tp2-f32")
    assert_losses_match(dtensor, [scratch[s] for s in sorted(scratch)], "dtensor against scratch", "float32")
    assert_losses_match(dtensor, reference("float32"), "dtensor against single device", "float32")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_resume_same_and_other_tp(runs):
    # the dp=2 x tp=2 run saved at step HALF (--save-every HALF) on its way to STEPS
    uninterrupted = runs("dp2tp2-f32")
    meta = [ckpt.read_metadata(d)[1] for d in runs.dir.glob("ckpt/step_*")]
    assert sorted(m["step"] for m in meta) == [HALF, STEPS]
    # 1) resumed at the same tp: steps HALF..STEPS-1 bitwise equal to the uninterrupted run. Another
    #    run, the same bits: runs are deterministic, and the checkpoint lost nothing
    #    (weights, both AdamW moments and its step count)
    same = runs("resumed-tp2")
    assert_losses_match(same, [uninterrupted[s] for s in range(HALF, STEPS)], "resumed at tp=2",
                        "float32", first=HALF, exact=True)
    # 2) resumed at tp=4 (resharded weights and AdamW moments): equal within the tolerance
    other = runs("resumed-tp4")
    assert_losses_match(other, [uninterrupted[s] for s in range(HALF, STEPS)], "resumed at tp=4",
                        "float32", first=HALF)
    assert_losses_match(other, reference("float32")[HALF:], "resumed at tp=4 vs single device",
                        "float32", first=HALF)
