"""Gradient clipping under TP (numerics.clip) against torch.nn.utils.clip_grad_norm_ on one device.

float64, on simulated ranks: the global norm and every clipped gradient of GPT-2 and Llama (with
KV heads on several ranks when nkv < t), of Lesson 8's partial-sync GPT (private channels, against
its t-stream model) and of Lesson 12's DeepSeek-V3 (experts split over the group under expert
parallelism and expert tensor parallelism, against itself at t = 1) equal one device's within
the tolerance policy; the two wrong norms differ from it; a placement split over an "ep" group
counts each expert once. The dp x tp mesh runs under torchrun (tests/test_numerics_launch.py).
"""
import copy
import math

import pytest
import torch

from tests.slow import only_in_test_slow
from tp_from_scratch.comm import SPMDError, run_spmd
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.parallelize import gpt_to_tp, shard_tensor
from tp_from_scratch.numerics.clip import (clip_grad_norm, gpt_placement, grad_norm, norm_counting_replicas_t_times,
                                           norm_without_tp_sum, owns)

CASES = {"gpt2": dict(arch="gpt2", n_kv_heads=4), "llama": dict(arch="llama", n_kv_heads=1)}


def setup(name, max_norm=0.05, norm_type=2.0):
    config = GPTConfig(vocab_size=67, seq_len=16, n_layers=2, hidden=32, n_heads=4, **CASES[name])
    gpt = init_gpt(config, 0, torch.float64)
    gen = torch.Generator().manual_seed(1)
    idx, targets = (torch.randint(0, 67, (2, 16), generator=gen) for _ in range(2))
    reference = copy.deepcopy(gpt)
    reference(idx, targets)[1].backward()
    norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm, norm_type=norm_type)
    return config, gpt, (idx, targets), reference, norm


@pytest.mark.parametrize("t,norm_type", [(1, 2.0), (2, 2.0), (4, 2.0), (4, math.inf)],
                         ids=["t1", "t2", "t4", "t4-inf-norm"])
@pytest.mark.parametrize("name", list(CASES))
def test_the_norm_and_every_clipped_gradient_equal_clip_grad_norm_on_one_device(name, t, norm_type):
    config, gpt, batch, reference, want = setup(name, norm_type=norm_type)

    def rank(comm):
        model = gpt_to_tp(comm, gpt)
        model(*batch)[1].backward()
        norm = clip_grad_norm(model, 0.05, placement=gpt_placement(config, t), groups={"tp": comm},
                              norm_type=norm_type)
        return norm, {n: p.grad for n, p in model.named_parameters()}
    assert want > 0.05, "the reference must actually clip"
    for r, (norm, grads) in enumerate(run_spmd(rank, t)):
        assert_matches_reference(norm, want, name=f"{name} grad norm at t={t}", rank=r)
        for n, p in reference.named_parameters():
            assert_matches_reference(grads[n], shard_tensor(n, p.grad, t, r, config), name=f"clipped grad of {n}", rank=r)


@pytest.mark.parametrize("name", list(CASES))
def test_the_two_wrong_norms_differ_from_the_truth(name):
    config, gpt, batch, _, want = setup(name, max_norm=1e9)  # 1e9: measure, do not clip
    t = 4

    def rank(comm):
        model = gpt_to_tp(comm, gpt)
        model(*batch)[1].backward()
        return (grad_norm(model, placement=gpt_placement(config, t), groups={"tp": comm}),
                norm_counting_replicas_t_times(model, comm), norm_without_tp_sum(model))
    results = run_spmd(rank, t)
    right, too_big, local = results[0][0], results[0][1], [r[2] for r in results]
    assert_matches_reference(right, want, name="the right norm")
    # the replicated parameters (norms, row biases, wpe; llama's single KV head) counted t times
    assert too_big > want * (1 + 1e-3), (too_big, want)
    # each rank misses the other ranks' shards: too small, and the ranks disagree
    assert all(n < want * (1 - 1e-3) for n in local), (local, want)
    assert len({float(n) for n in local}) > 1, local


def test_a_placement_split_over_an_ep_group_counts_each_expert_once():
    # four "experts", one per rank, and one parameter every rank holds the same copy of
    experts = [torch.full((3,), float(e + 1), dtype=torch.float64) for e in range(4)]
    shared = torch.tensor([2.0, -1.0], dtype=torch.float64)
    want = torch.sqrt(sum(e.pow(2).sum() for e in experts) + shared.pow(2).sum())

    def rank(comm):
        params = {"expert": torch.nn.Parameter(experts[comm.rank].clone()), "shared": torch.nn.Parameter(shared.clone())}
        for p in params.values():
            p.grad = p.detach().clone()
        placement = lambda n: {"ep": 1} if n == "expert" else {}  # noqa: E731
        return grad_norm(list(params.items()), placement=placement, groups={"ep": comm})
    for r, norm in enumerate(run_spmd(rank, 4)):
        assert_matches_reference(norm, want, name="norm over ep", rank=r)


def test_ownership_follows_the_placement():
    assert owns({}, {"tp": 0, "dp": 0}) and not owns({}, {"tp": 1, "dp": 0}) and not owns({}, {"tp": 0, "dp": 1})
    assert owns({"tp": 1}, {"tp": 3, "dp": 0}) and not owns({"tp": 1}, {"tp": 3, "dp": 1})
    assert owns({"tp": 2}, {"tp": 2}) and not owns({"tp": 2}, {"tp": 3})  # the first of each 2 replicas
    assert owns({"tp": 1, "dp": 1}, {"tp": 1, "dp": 1})                 # a ZeRO-sharded gradient


def test_a_placement_naming_a_group_not_given_is_refused():
    def rank(comm):
        p = torch.nn.Parameter(torch.ones(2))
        p.grad = torch.ones(2)
        grad_norm([("w", p)], placement=lambda n: {"ep": 1}, groups={"tp": comm})
    with pytest.raises(SPMDError, match=r"names the groups \['ep'\], but groups= has only \['tp'\]"):
        run_spmd(rank, 2)


# ---------------------------------------------------------------------------------------
# Lesson 8's private channels and Lesson 12's experts: the same norm, placed by their plans
# ---------------------------------------------------------------------------------------

def clipped_reference(model, loss):
    """loss.backward() on the single-device ``model``, then torch's clip_grad_norm_ at half the
    norm (so that it clips); returns (max_norm, the norm clip_grad_norm_ returned)."""
    loss.backward()
    max_norm = 0.5 * torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item()
    return max_norm, torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


@pytest.mark.parametrize("t,p", [(2, 0.5), (4, 0.5), (4, 0.0)], ids=["t2-p0.5", "t4-p0.5", "t4-p0"])
def test_partial_sync_private_channels_clip_as_clip_grad_norm_on_the_t_stream_model(t, p):
    # Lesson 8's CAAT GPT: the rows' private channels make every rank's stream its own model, the
    # streams' shared parameters (norms, row biases) get their gradients summed after backward;
    # then they are replicated and counted once, the shards (KV heads held by 2 ranks at t = 4:
    # by the first of the 2) once each: the GPT's placement, read off the same plan
    from tp_from_scratch.gpt.data import global_batch
    from tp_from_scratch.partial_sync.autograd import all_reduce_replicated_grads
    from tp_from_scratch.partial_sync.model import caat_from_gpt, t_stream_forward
    config = GPTConfig(vocab_size=37, seq_len=16, n_layers=2, hidden=32, n_heads=4, n_kv_heads=2)
    gpt = init_gpt(config, 3, torch.float64)
    x, y = global_batch(0, 4, config.seq_len, config.vocab_size, 3)
    reference = copy.deepcopy(gpt)
    max_norm, want = clipped_reference(reference, t_stream_forward(reference, x, y, t, p)[1])

    def rank(comm):
        model = caat_from_gpt(comm, gpt, p)
        model(x, y)[1].backward()
        all_reduce_replicated_grads(comm, model)
        norm = clip_grad_norm(model, max_norm, placement=gpt_placement(config, t), groups={"tp": comm})
        return norm, {n: q.grad for n, q in model.named_parameters()}
    for r, (norm, grads) in enumerate(run_spmd(rank, t)):
        assert_matches_reference(norm, want, name=f"partial sync grad norm at t={t}, p={p}", rank=r)
        for n, q in reference.named_parameters():
            assert_matches_reference(grads[n], shard_tensor(n, q.grad, t, r, config), name=f"clipped grad of {n}",
                                     rank=r)


@pytest.mark.parametrize("layout", ["expert parallel", "expert tensor parallel", "experts on all tokens"])
def test_deepseek_experts_clip_as_clip_grad_norm_on_one_device(layout):
    # Lesson 12's DeepSeek-V3 at t = 2 against itself at t = 1: under expert parallelism each rank
    # holds half the experts and its own rows of the batch, everything else whole with its
    # gradient summed over the group (sum_replicated_gradients); under expert tensor parallelism
    # every expert's F columns are split. The placement is the plan's (deepseek.arch.clip_placement)
    from tp_from_scratch.comm import Comm
    from tp_from_scratch.deepseek.arch import clip_placement, shard
    from tp_from_scratch.deepseek.model import from_hf_state_dict, hf_name
    from tp_from_scratch.deepseek.train import CausalLM, init_model, parse, sum_replicated_gradients
    from tp_from_scratch.gpt.data import global_batch
    t, config = 2, parse(["--dtype", "float64"]).model
    full = init_model(config, 4, torch.float64)
    x, y = global_batch(0, 4, 16, config.vocab_size, 4)
    sd = {hf_name(n): v for n, v in full.model.state_dict().items()}

    def parallel(comm):
        return CausalLM(from_hf_state_dict(config, sd, group=comm, layout=layout, dtype=torch.float64))
    reference = parallel(Comm(0, 1))   # t = 1: the whole model on one device
    max_norm, want = clipped_reference(reference, reference(x, y)[1])

    def rank(comm):
        model = parallel(comm)
        model(x, y)[1].backward()
        sum_replicated_gradients(model)   # a no-op unless the layout is expert parallel
        norm = clip_grad_norm(model, max_norm, placement=clip_placement(layout), groups={"tp": comm})
        return norm, {n: q.grad for n, q in model.named_parameters()}
    split = [n for n, _ in reference.named_parameters() if clip_placement(layout)(n)]
    assert any(".experts." in n for n in split), "the experts must be split, or the test proves nothing"
    for r, (norm, grads) in enumerate(run_spmd(rank, t)):
        assert_matches_reference(norm, want, name=f"DeepSeek-V3 grad norm ({layout}, t={t})", rank=r)
        for n, q in reference.named_parameters():
            assert_matches_reference(grads[n], shard(n, q.grad, layout, t, r), name=f"clipped grad of {n}", rank=r)


# ---------------------------------------------------------------------------------------
# --clip-grad-norm in the one trainer (gpt/train.py, gpt/step.py's train_step)
# ---------------------------------------------------------------------------------------

TRAIN_CASES = {"gpt2": ["--arch", "gpt2", "--heads", 4], "llama-one-kv-head": ["--arch", "llama", "--heads", 4,
                                                                                "--kv-heads", 1]}
TINY = ["--hidden", 32, "--layers", 1, "--seq-len", 8, "--steps", 4, "--dtype", "float64"]


@pytest.mark.parametrize("case", list(TRAIN_CASES))
def test_the_trainers_clip_grad_norm_trains_as_clip_grad_norm_on_one_device(case):
    # t = 4 simulated ranks (llama: its one KV head on all four) against the single-device
    # reference, which clips with torch.nn.utils.clip_grad_norm_; 0.1 clips every step here
    from tp_from_scratch.gpt import train
    from tp_from_scratch.gpt.step import single_device_run
    argv = [str(a) for a in TRAIN_CASES[case] + TINY + ["--clip-grad-norm", 0.1]]
    opts = train.parse(argv)
    want = [loss for _, loss in single_device_run(opts.model, opts)]
    unclipped = [loss for _, loss in single_device_run(opts.model, train.parse(argv[:-2]))]
    assert any(abs(a.item() - b.item()) > 1e-9 for a, b in zip(want, unclipped)), "0.1 must actually clip"
    for rank, losses in enumerate(run_spmd(train.train_on_comm, 4, argv)):
        for step, (got, ref) in enumerate(zip(losses, want)):
            assert_matches_reference(torch.tensor(got, dtype=torch.float64), ref, name=f"{case} loss at step {step}",
                                     rank=rank, tol=tolerance(torch.float64, steps=step))


LESSON_TRAINERS = {
    # Lesson 8 at t = 4, p = 0.5 (its KV heads held by 2 ranks each), against the t-stream model
    "partial_sync": (["--tp", 4, "--sync-fraction", 0.5, "--heads", 4, "--kv-heads", 2, "--layers", 2, "--hidden", 32,
                      "--seq-len", 8, "--steps", 4, "--dtype", "float64"], "t_stream_losses", lambda r: r["losses"]),
    # Lesson 12 under expert parallelism at t = 2 (4 experts a rank), against one device
    "deepseek": (["--tp", 2, "--layout", "ep", "--steps", 4, "--dtype", "float64"], "single_device_losses",
                 lambda r: r),
}


@pytest.mark.parametrize("lesson", list(LESSON_TRAINERS))
def test_lesson_8_and_12_trainers_clip_grad_norm_as_clip_grad_norm_on_one_device(lesson):
    import importlib
    module = importlib.import_module(f"tp_from_scratch.{lesson}.train")
    argv, reference, losses_of = LESSON_TRAINERS[lesson]
    argv = [str(a) for a in argv + ["--clip-grad-norm", 0.1]]   # 0.1 clips every step here
    want = [torch.as_tensor(loss, dtype=torch.float64) for loss in getattr(module, reference)(argv)]
    unclipped = getattr(module, reference)(argv[:-2])
    assert any(abs(float(a) - float(b)) > 1e-9 for a, b in zip(want, unclipped)), "0.1 must actually clip"
    t = int(argv[1])
    for rank, result in enumerate(run_spmd(module.train_on_comm, t, argv)):
        for step, (got, ref) in enumerate(zip(losses_of(result), want)):
            assert_matches_reference(torch.tensor(got, dtype=torch.float64), ref, name=f"{lesson} loss at step {step}",
                                     rank=rank, tol=tolerance(torch.float64, steps=step))


@pytest.mark.parametrize("trainer", ["parallelisms.train"])
def test_a_trainer_whose_norm_is_not_proven_refuses_clip_grad_norm_by_name(monkeypatch, capsys, trainer):
    import importlib
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(f"tp_from_scratch.{trainer}").main(["--tp", "2", "--clip-grad-norm", "1.0"])
    assert exit_info.value.code == 2
    assert f"--clip-grad-norm is not offered by {trainer} yet" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--clip-grad-norm", "0"], "--clip-grad-norm must be greater than 0, got 0.0"),
    (["--clip-grad-norm", "1", "--impl", "dtensor"], "--clip-grad-norm works with --impl scratch only"),
])
def test_gpt_train_refuses_a_clip_grad_norm_it_cannot_honour(monkeypatch, capsys, argv, message):
    from tp_from_scratch.gpt import train
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit):
        train.main(["--tp", "2", *argv])
    assert message in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("trainer,arch", [("gpt.train", ["--arch", "llama", "--kv-heads", "1"]),
                                          pytest.param("sequence_parallel.train", ["--arch", "gpt2"],
                                                       marks=only_in_test_slow("a second dp x tp launch"))],
                         ids=["gpt-llama-one-kv-head", "sp-gpt2-layernorms"])
def test_clip_grad_norm_on_a_dp_x_tp_mesh_under_torchrun_equals_one_device(trainer, arch):
    # dp = 2 x tp = 2, float64: every step's loss equal to the single-device run clipped by
    # torch's clip_grad_norm_. Llama's one KV head is replicated on both TP ranks; under SP the
    # LayerNorms' gradients are summed over the sequence shards, then replicated
    from tp_from_scratch.comm.launchers import run_command, torchrun_command
    result = run_command(torchrun_command(4, f"tp_from_scratch.{trainer}", "--tp", "2", *arch, "--heads", "4",
                                          "--hidden", "32", "--layers", "2", "--steps", "10", "--dtype", "float64",
                                          "--clip-grad-norm", "0.1", "--compare-single", "--no-progress"), timeout=380)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "single-device comparison: 10 of 10 steps equal" in result.stdout, result.stdout[-3000:]
