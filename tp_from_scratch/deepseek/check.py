"""Each MoE layout, and the whole DeepSeek-V3 model (MLA + MoE), against one device on any
group: output, input gradient, every weight's gradient.

Every rank builds the same single-device DeepSeekMoE and the same data from one seed, runs
them, and compares its own share of every result through assert_matches_reference. The
expected share of each gradient is cut by the layout's own ``from_module`` applied to the
reference's gradients, so the slicing is written once. The same function runs on simulated
ranks (tests, Lesson 12) and on real processes: under torchrun with native collectives (the
process group) and from-scratch ones (a TorchComm over it), under mpiexec on Lesson 2's
collectives over MPI (the torch layers reach a Comm through nn/collectives.py's bridge):

    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.deepseek.check
    .venv/bin/mpiexec -n 4 .venv/bin/python -m tp_from_scratch.deepseek.check
"""
import argparse
import copy
import os
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist

from tp_from_scratch.comm.launch import launcher_from_env, spmd_main, torch_main
from tp_from_scratch.comm.torch_comm import TorchComm
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.gpt.options import greater_than_zero, parse_valid_args
from tp_from_scratch.testing import random_array, rank_rng

from .config import MoEConfig
from .expert_parallel import LAYOUTS, check_fits
from .arch import shard
from .model import ParallelDeepseekV3, check_config
from .moe import DeepSeekMoE
from .router import check_routing_margin, routing_margin

# small enough for a test, with groups, shared experts and k > 1; divisible by t = 1, 2, 4
TINY = MoEConfig(hidden_size=32, moe_intermediate_size=12, n_routed_experts=8, num_experts_per_tok=3,
                 n_group=4, topk_group=2, routed_scaling_factor=2.5, n_shared_experts=2)


def random_moe(config, seed):
    """A DeepSeekMoE in float64 with every weight and the selection bias drawn at random."""
    moe = DeepSeekMoE(config).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=g, dtype=torch.float64))
        moe.gate.e_score_correction_bias.copy_(0.3 * torch.randn(config.n_routed_experts, generator=g,
                                                                 dtype=torch.float64))
    return moe


def layout_data(layout, t, hidden, seed, tokens=13):
    """(xs, dys), one per rank: under expert parallelism every rank brings its own 5 + r
    tokens; otherwise every rank holds the same ``tokens`` tokens (replicated)."""
    def draw(salt, rank, n):
        return torch.tensor(random_array(rank_rng(seed + salt, rank), (n, hidden)))
    if layout == "expert parallel":
        return [draw(0, r, 5 + r) for r in range(t)], [draw(1, r, 5 + r) for r in range(t)]
    return [draw(0, 0, tokens)] * t, [draw(1, 0, tokens)] * t


def _share(layout, module, group):
    """This rank's share of ``module``'s parameters, cut the way the layout cuts them."""
    return dict(LAYOUTS[layout].from_module(module, group=group).double().named_parameters())


def check_layout(group, layout, reference, xs, dys):
    """Run the layout on this rank's xs/dys and compare with the reference on all of them.

    Returns (bytes this rank sent in the forward, the layer's dispatch counts or None); the
    bytes are those of ``group.meter`` (a Comm), or None on a ProcessGroup.
    """
    rank = dist.get_rank(group) if isinstance(group, dist.ProcessGroup) else group.rank
    reference = copy.deepcopy(reference)  # simulated ranks share the caller's module
    full_x = torch.cat(xs) if layout == "expert parallel" else xs[0]
    full_dy = torch.cat(dys) if layout == "expert parallel" else dys[0]
    gate = reference.gate
    check_routing_margin(routing_margin(full_x, gate.weight, gate.e_score_correction_bias, reference.config),
                         full_x.dtype)
    x_ref = full_x.clone().requires_grad_(True)
    y_ref = reference(x_ref)
    (y_ref * full_dy).sum().backward()

    layer = LAYOUTS[layout].from_module(reference, group=group).double()
    x = xs[rank].clone().requires_grad_(True)
    meter = getattr(group, "meter", None)
    if meter is not None:
        meter.reset()
    y = layer(x)
    sent = meter.bytes_sent if meter is not None else None
    (y * dys[rank]).sum().backward()

    start = sum(len(xq) for xq in xs[:rank]) if layout == "expert parallel" else 0
    rows = slice(start, start + len(xs[rank]))
    assert_matches_reference(y, y_ref[rows], name=f"{layout} output", rank=rank)
    assert_matches_reference(x.grad, x_ref.grad[rows], name=f"{layout} input gradient", rank=rank)
    gradients = copy.deepcopy(reference)
    with torch.no_grad():
        for p, source in zip(gradients.parameters(), reference.parameters()):
            p.copy_(source.grad)
    expected = _share(layout, gradients, group)
    got = dict(layer.named_parameters())
    assert got.keys() == expected.keys(), (sorted(got), sorted(expected))
    for name, g in expected.items():
        assert_matches_reference(got[name].grad, g, name=f"{layout} grad {name}", rank=rank)
    return sent, getattr(layer, "last_counts", None)


def tiny_model_config():
    """A DeepseekV3-shaped config (transformers' attribute names) for the checks, without
    importing transformers into every launched process: 3 layers, the first dense."""
    return SimpleNamespace(
        vocab_size=67, hidden_size=32, intermediate_size=48, num_hidden_layers=3, first_k_dense_replace=1,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=8, qk_nope_head_dim=6,
        qk_rope_head_dim=4, v_head_dim=5, rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
        rope_interleave=True, rms_norm_eps=1e-6, attention_bias=False, hidden_act="silu",
        moe_intermediate_size=12, n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2,
        norm_topk_prob=True, routed_scaling_factor=2.5, n_shared_experts=2)


def check_model(group, config, state, layout, ids, dlogits, reference):
    """Rank r's ParallelDeepseekV3 (its share of the full ``state``) against ``reference``:
    (logits, {name: gradient}) of the same model on one rank."""
    t = dist.get_world_size(group) if isinstance(group, dist.ProcessGroup) else group.world_size
    rank = dist.get_rank(group) if isinstance(group, dist.ProcessGroup) else group.rank
    model = ParallelDeepseekV3(config, group=group, layout=layout).double()
    model.load_state_dict({n: shard(n, v, layout, t, rank) for n, v in state.items()})
    logits = model(ids)
    (logits * dlogits).sum().backward()
    ref_logits, ref_grads = reference
    assert_matches_reference(logits, ref_logits, name=f"model logits ({layout})", rank=rank)
    for name, p in model.named_parameters():
        expected = shard(name, ref_grads[name], layout, t, rank)
        assert_matches_reference(p.grad, expected, name=f"model grad {name} ({layout})", rank=rank)


def model_reference(config, seed):
    """(full state dict, ids, dlogits, (logits, gradients)) of a random model on one rank."""
    from tp_from_scratch.comm import run_spmd

    def one_rank(comm):
        model = ParallelDeepseekV3(config, group=comm).double()
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(0.2 * torch.randn(p.shape, generator=g, dtype=torch.float64))
        ids = torch.randint(0, config.vocab_size, (2, 6), generator=g)
        dlogits = torch.randn(2, 6, config.vocab_size, generator=g, dtype=torch.float64)
        logits = model(ids)
        (logits * dlogits).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        return model.state_dict(), ids, dlogits, (logits.detach(), grads)

    return run_spmd(one_rank, 1)[0]


def run_checks(groups, t):
    """Every layout and the model on each (name, group) of ``groups``, t ranks each; returns
    what passed (raises at the first mismatch)."""
    reference = random_moe(TINY, seed=t)
    done = []
    for layout in LAYOUTS:
        xs, dys = layout_data(layout, t, TINY.hidden_size, seed=10 * t)
        for name, group in groups:
            check_layout(group, layout, reference, xs, dys)
            done.append(f"{layout} ({name})")
    config = tiny_model_config()
    state, ids, dlogits, reference = model_reference(config, seed=t)
    for layout in ("experts on all tokens", "expert tensor parallel"):
        for name, group in groups:
            check_model(group, config, state, layout, ids, dlogits, reference)
            done.append(f"model with {layout} ({name})")
    return done


def world_problem(t):
    """Why the checks' tiny layer and model cannot be cut over t ranks in every layout they check,
    as a sentence; None if they can."""
    try:
        for layout in LAYOUTS:
            check_fits(layout, TINY, t)
        for layout in ("experts on all tokens", "expert tensor parallel"):
            check_config(tiny_model_config(), t, layout)
    except ValueError as e:
        return str(e)
    return None


def validate(args, world):
    """The first problem with the flags and the number of ranks, as a sentence; None if fine."""
    problem = world_problem(world)
    if problem:
        fits = ", ".join(str(t) for t in range(1, 9) if world_problem(t) is None)
        return f"{world} ranks: {problem}: the checks' tiny model runs on {fits} ranks"
    return greater_than_zero("--timeout", args.timeout)


def launched_world():
    """The number of ranks torchrun or mpiexec started (1 under plain python)."""
    return int(next((os.environ[k] for k in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE") if k in os.environ), 1))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tp_from_scratch.deepseek.check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds any collective may wait")
    args = parse_valid_args(parser, validate, argv, launched_world())
    if launcher_from_env() == "mpi":   # spmd_main names a failing rank and brings the job down
        def on_mpi(comm):
            comm.timeout = args.timeout
            done = run_checks([("mpi", comm)], comm.world_size)
            # one write, newline included: print's text and newline can part under mpiexec's
            # forwarding, and two ranks' lines then ran together
            sys.stdout.write(f"rank {comm.rank}: deepseek checks passed: {'; '.join(done)}\n")
            sys.stdout.flush()
        spmd_main(on_mpi)
        return
    torch_main(lambda: on_torch(args.timeout), timeout=args.timeout, quick_exit=True)


def on_torch(timeout):
    """Every check on the world group, native and on a TorchComm over it; each rank prints a line."""
    world, rank, t = dist.group.WORLD, dist.get_rank(), dist.get_world_size()
    done = run_checks([("native", world), ("scratch", TorchComm(world, timeout=timeout))], t)
    sys.stdout.write(f"rank {rank}: deepseek checks passed: {'; '.join(done)}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
