"""The planner's formulas against the things they describe, counted at test time.

* parameters: Megatron-LM 2019 Table 1's four GPT-2 models, and for our own model the exact
  sum(p.numel()) of the single-device GPT and of each TP rank's shard;
* FLOPs: torch's FlopCounterMode on a real forward, and forward + backward;
* bytes: the Comm meter of every simulated TP rank after real training steps, and the
  trainer's own report under torchrun for dp=2 x tp=2 (checked in tests/test_train.py's launch).
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.cost import calibrate, planner
from tp_from_scratch.cost import model as cost
from tp_from_scratch.gpt import inventory, train
from tp_from_scratch.gpt.arch import ARCHS
from tp_from_scratch.gpt.model import GPT, GPTConfig, count_parameters, init_gpt
from tp_from_scratch.gpt.parallelize import gpt_to_tp


def gpt2(hidden, heads, layers, vocab=51200, seq=1024):
    return GPTConfig(vocab_size=vocab, seq_len=seq, n_layers=layers, hidden=hidden,
                     n_heads=heads, n_kv_heads=heads)


# ---- parameters -------------------------------------------------------------------------

@pytest.mark.parametrize("hidden, heads, layers, exact, paper", [
    (1536, 16, 40, 1_213_479_936, "1.2B"),
    (1920, 20, 54, 2_490_408_960, "2.5B"),
    (2304, 24, 64, 4_199_109_120, "4.2B"),
    (3072, 32, 72, 8_317_040_640, "8.3B"),
])
def test_megatron_table1_gpt2_sizes(hidden, heads, layers, exact, paper):
    # Shoeybi et al. 2019, Table 1: vocabulary 51,200, sequence 1024, GPT-2 blocks (12H^2 + 13H each)
    n = inventory.parameter_count(gpt2(hidden, heads, layers), "gpt2")
    assert n == exact
    assert inventory.rounded(n) == paper


def test_well_known_sizes_gpt2_small_and_llama3():
    assert inventory.parameter_count(gpt2(768, 12, 12, vocab=50257), "gpt2") == 124_439_808
    llama3_8b = GPTConfig(vocab_size=128256, seq_len=8192, n_layers=32, hidden=4096, n_heads=32,
                          n_kv_heads=8, ffn=14336, tie_embeddings=False)
    assert inventory.parameter_count(llama3_8b, "llama") == 8_030_261_248
    llama3_70b = GPTConfig(vocab_size=128256, seq_len=8192, n_layers=80, hidden=8192, n_heads=64,
                           n_kv_heads=8, ffn=28672, tie_embeddings=False)
    assert inventory.rounded(inventory.parameter_count(llama3_70b, "llama")) == "70.6B"


CONFIGS = {
    "default (tied, GQA 8/4)": GPTConfig(),
    "untied": GPTConfig(tie_embeddings=False),
    "GQA 8/2, ffn 100": GPTConfig(n_kv_heads=2, ffn=100),
    "multi-head, untied, odd vocab": GPTConfig(vocab_size=101, n_kv_heads=8, tie_embeddings=False),
    "t=3 shapes": GPTConfig(hidden=48, n_heads=6, n_kv_heads=3, ffn=96, n_layers=3),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_exact_count_equals_the_models_numel(name):
    config = CONFIGS[name]
    assert inventory.parameter_count(config) == sum(p.numel() for p in GPT(config).parameters())
    # and every tensor the planner lists is a parameter of that shape (once per layer)
    shapes = {n: p.numel() for n, p in GPT(config).named_parameters()}
    for tensor in inventory.parameters(config):
        found = [v for n, v in shapes.items() if n == tensor.name or n.endswith("." + tensor.name)]
        assert len(found) == tensor.copies and sum(found) == tensor.count(), tensor.name


MODEL_HAS_ARCHS = "arch" in GPTConfig.__dataclass_fields__
ARCH_CONFIGS = {  # the other architectures, built by the model itself
    "gpt2 (key bias, tied)": dict(arch="gpt2", n_kv_heads=8),
    "gpt2 untied": dict(arch="gpt2", n_kv_heads=8, tie_embeddings=False),
    "llama (RMSNorm, SwiGLU, RoPE, untied)": dict(arch="llama", n_kv_heads=2, ffn=96),
    "llama tied": dict(arch="llama", tie_embeddings=True),
}


@pytest.mark.skipif(not MODEL_HAS_ARCHS, reason="this GPTConfig has no arch field yet")
@pytest.mark.parametrize("name", ARCH_CONFIGS)
def test_exact_count_of_the_other_architectures(name):
    config = GPTConfig(**ARCH_CONFIGS[name])
    model = GPT(config)
    shapes = {n: p.numel() for n, p in model.named_parameters()}
    assert inventory.parameter_count(config) == sum(shapes.values())
    for tensor in inventory.parameters(config):
        found = [v for n, v in shapes.items() if n == tensor.name or n.endswith("." + tensor.name)]
        assert len(found) == tensor.copies and sum(found) == tensor.count(), tensor.name
    # and the FLOPs of a forward and a whole step (SwiGLU: three matmuls of H x F)
    idx = torch.randint(0, config.vocab_size, (2, config.seq_len))
    with FlopCounterMode(display=False) as step:
        _, loss = model(idx, idx)
        loss.backward()
    assert step.get_total_flops() == cost.step_flops(config, None, 2)


@pytest.mark.parametrize("name, t", [("default (tied, GQA 8/4)", 2), ("untied", 4),
                                     ("multi-head, untied, odd vocab", 4), ("t=3 shapes", 3),
                                     ("GQA 8/2, ffn 100", 4)])
def test_local_count_equals_each_tp_ranks_shard(name, t):
    # the vocabulary splits unevenly (67 and 101 are prime): ranks hold different counts;
    # with 2 KV heads on 4 ranks each KV head is held whole by 2 ranks
    config = CONFIGS[name]
    full = init_gpt(config, 0)
    counts = run_spmd(lambda comm: count_parameters(gpt_to_tp(comm, full))[0], t)
    assert counts == [inventory.parameter_count(config, "gpt", t, r) for r in range(t)]


# ---- FLOPs ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["default (tied, GQA 8/4)", "GQA 8/2, ffn 100", "multi-head, untied, odd vocab"])
def test_flops_equal_torchs_flop_counter(name):
    config = CONFIGS[name]
    model = init_gpt(config, 0)
    idx = torch.randint(0, config.vocab_size, (3, config.seq_len))
    with FlopCounterMode(display=False) as forward:
        model(idx, idx)
    with FlopCounterMode(display=False) as step:
        _, loss = model(idx, idx)
        loss.backward()
    assert forward.get_total_flops() == cost.forward_flops(config, "gpt", 3)
    assert step.get_total_flops() == cost.step_flops(config, "gpt", 3)


# ---- bytes on the wire ------------------------------------------------------------------

TRAIN_CONFIGS = {  # name -> (tp, extra trainer flags); hidden 48 with 6 / 3 heads makes t=3 valid
    "t=1": (1, []),
    "t=2": (2, []),
    "t=3, uneven vocabulary": (3, ["--hidden", "48", "--heads", "6", "--kv-heads", "3"]),
    "t=4, untied": (4, ["--untied"]),
    "t=4, 2 KV heads (each on 2 ranks)": (4, ["--kv-heads", "2"]),
    "t=3, 1 KV head (on all 3 ranks)": (3, ["--hidden", "48", "--heads", "6", "--kv-heads", "1"]),
}
STEPS = 2


@pytest.mark.parametrize("name", TRAIN_CONFIGS)
def test_ring_bytes_equal_the_meter_of_every_simulated_rank(name):
    # train_on_comm: the trainer's own model, data and optimizer on run_spmd's ranks, whose
    # collectives are the from-scratch ring; the meter books every message each rank sends
    t, flags = TRAIN_CONFIGS[name]
    argv = ["--tp", str(t), "--steps", str(STEPS), *flags]

    def rank(comm):
        comm.meter.reset()
        train.train_on_comm(comm, argv)
        return comm.meter.snapshot()

    args = train.parse(argv)
    config = args.model
    for r, meter in enumerate(run_spmd(rank, t, timeout=60)):
        rows = cost.traffic(config, t, args.batch_size, itemsize=4, tp_rank=r)
        assert meter["by_collective"]["all_reduce"]["calls"] == STEPS * sum(x["calls"] for x in rows)
        assert meter["messages_sent"] == STEPS * sum(x["ring_messages"] for x in rows)
        assert meter["bytes_sent"] == STEPS * sum(x["ring_bytes"] for x in rows), f"rank {r}"


# The dp=2 x tp=2 trainer's printed bytes against this cost model: tests/test_train.py, in its
# launch of 4 processes (test_dp2_tp2_trainer_reports_the_predicted_bytes).


# ---- element-wise work --------------------------------------------------------------------

class _ElementsSeen(TorchDispatchMode):
    """Adds up, per aten op, the elements of its first input: what the op goes over."""

    def __init__(self):
        super().__init__()
        self.elements = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if args and isinstance(args[0], torch.Tensor):
            name = str(func).split(".")[1]
            if name == "neg" and args[0].dim() == 4:  # RoPE's rotate_half of (B, n, T, hs) heads
                name = "neg of heads"
            self.elements[name] = self.elements.get(name, 0) + args[0].numel()
        return func(*args, **(kwargs or {}))


def _forward_elements(config, t, batch):
    """Each simulated TP rank's elements per aten op in one forward of the (TP) model, and the
    elements of its linear layers' biases."""
    def one_rank(comm):
        model = init_gpt(config, 0) if t == 1 else gpt_to_tp(comm, init_gpt(config, 0))
        idx = torch.randint(0, config.vocab_size, (batch, config.seq_len), generator=torch.Generator().manual_seed(1))
        with _ElementsSeen() as seen:
            model(idx, idx)
        biases = sum(p.numel() for name, p in model.named_parameters()
                     if name.endswith(".bias") and (".attn." in name or ".mlp." in name))
        return dict(seen.elements, biases=biases)
    return run_spmd(one_rank, t)


@pytest.mark.parametrize("arch, t, kv", [("gpt", 1, 2), ("gpt", 2, 4), ("gpt", 2, 2), ("llama", 1, 2), ("llama", 2, 2)])
def test_elementwise_counts_equal_what_the_models_ops_go_over(arch, t, kv):
    # each family's count against the aten ops one forward actually runs, on every rank:
    # the norms (LayerNorm, or RMSNorm's square), the activation, the softmax, the strided copies
    # (clone), the residual and bias adds (gpt: RoPE's adds are on q and k), and the loss's logits
    config = GPTConfig(vocab_size=51, seq_len=8, n_layers=2, hidden=32, n_heads=4, n_kv_heads=kv, arch=arch)
    for rank, seen in enumerate(_forward_elements(config, t, batch=3)):
        predicted = cost.elementwise_elements(config, None, 3, t, rank)
        norm, activation = ("rmsnorm", "swiglu") if arch == "llama" else ("layernorm", "gelu")
        assert predicted[norm] == seen["pow" if arch == "llama" else "native_layer_norm"]
        assert predicted[activation] == seen["silu" if arch == "llama" else "gelu"]
        assert predicted["softmax"] == seen["_softmax"]
        assert predicted["copy"] == seen["clone"]
        assert predicted["cross_entropy"] == seen["_log_softmax" if t == 1 else "max"]
        assert predicted["bias_grad"] == 3 * config.seq_len * seen["biases"]  # each bias: a sum over N tokens
        if arch == "gpt":
            assert predicted["add"] == seen["add"]
        else:  # x cos + rotate_half(x) sin negates one half of every rotated q and k
            assert predicted["rope"] == 2 * seen["neg of heads"]


def test_predicted_step_is_the_sum_of_its_parts_and_the_gpu_presets_price_bytes():
    config = gpt2(768, 12, 12, vocab=50257)
    profile = cost.load_profile("h100-nvlink")
    p = cost.predict_step(config, profile, 2, 8, itemsize=2, arch="gpt2")
    assert p["step_s"] == pytest.approx(p["compute_s"] + p["elementwise_s"] + p["communication_s"] + p["overhead_s"])
    elements = cost.elementwise_elements(config, "gpt2", 8, 2)
    moved = sum(n * cost.ELEMENTWISE_PASSES[op] * (4 if op == "adamw" else 2) for op, n in elements.items())
    assert p["elementwise_s"] == pytest.approx(moved / 3.35e12)
    # the replicated share does not shrink with t: the norms and residual adds are whole on every rank
    assert cost.elementwise_elements(config, "gpt2", 8, 4)["layernorm"] == elements["layernorm"]
    assert cost.elementwise_elements(config, "gpt2", 8, 4)["gelu"] * 2 == elements["gelu"]


def test_every_counted_op_has_a_calibration_and_a_gpu_price():
    # the calibration times exactly the ops the planner counts, so no profile lacks one
    makers, elements = calibrate.elementwise_workloads(n=2 ** 16, parameters=2 ** 12)
    assert set(makers) == set(cost.ELEMENTWISE_PASSES) == set(elements)
    counted = set()
    for arch in ARCHS:
        for t in (1, 2):
            counted |= set(cost.elementwise_elements(GPTConfig(arch=arch), arch, 2, t))
    assert counted == set(makers)
    for run in (make() for make in makers.values()):
        run()  # each workload runs as the calibration runs it


def test_plan_refuses_an_all_reduce_the_profile_has_not_fitted(capsys):
    with pytest.raises(SystemExit):
        planner.main(["--profile", "h100-nvlink", "--collectives", "mpi"])
    assert "--collectives mpi: profile h100-nvlink has no fit of that all-reduce" in capsys.readouterr().err


# ---- the command line: no profile needed for sizes, bad input refused in one line --------

MEGATRON_8B = ["--arch", "gpt2", "--hidden", "3072", "--heads", "32", "--layers", "72", "--vocab-size", "51200",
               "--seq-len", "1024", "--tp", "8"]


def test_planner_without_a_profile_prints_sizes_and_says_how_to_get_step_times(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no runs/profile.json here: nothing was calibrated
    assert planner.main(MEGATRON_8B) == 0
    out = capsys.readouterr().out
    assert "parameters: 8,317,040,640 exactly" in out
    assert "memory per rank (GiB" in out and "communication per step on rank 0, tp=8" in out
    # the bytes of every call site, as the cost model counts them
    config = planner.config_from_args(planner.build_parser().parse_args(MEGATRON_8B))
    total = sum(r["payload_bytes"] for r in cost.traffic(config, 8, 8))
    assert f"{total:,}" in out
    assert "step times need a profile" in out and "--calibrate" in out and "h100-nvlink" in out
    assert "compute ms" not in out  # no times without a profile


def test_planner_says_which_precision_its_memory_assumes(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    planner.main(MEGATRON_8B + ["--dtype", "bfloat16"])
    out = capsys.readouterr().out
    assert "--dtype bfloat16 is what the all-reduces carry; this table assumes --precision fp32" in out
    planner.main(MEGATRON_8B + ["--dtype", "bfloat16", "--precision", "mixed"])
    assert "this table assumes" not in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--batch-size", "-8"], "--batch-size must be at least 1, got -8"),         
    (["--dp", "0"], "--dp must be at least 1, got 0"),                            
    (["--dp", "-1"], "--dp must be at least 1, got -1"),
    (["--dp", "3"], "--dp 3 does not divide the batch size (8)"),                   # as the trainer demands
    (["--tp", "0"], "--tp must be at least 1, got 0"),
    (["--kv-heads", "0"], "--kv-heads must be at least 1, got 0"),
])
def test_planner_refuses_bad_sizes_in_one_line(capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        planner.main(["--profile", "h100-nvlink", *flags])
    err = capsys.readouterr()
    assert exit_info.value.code == 2 and err.out == ""
    assert err.err.strip().splitlines()[-1].endswith(message)


def test_planner_refuses_a_profile_that_is_not_json_naming_the_file(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": ')
    for profile, problem in ((bad, "not a readable JSON file"), (tmp_path / "none.json", "no such file")):
        with pytest.raises(SystemExit) as exit_info:
            planner.main(["--profile", str(profile)])
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert exit_info.value.code == 2 and f"--profile {profile}: {problem}" in err
