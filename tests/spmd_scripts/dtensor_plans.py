"""PyTorch's DTensor plans of every architecture against one device, in ONE launch.

    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tests.spmd_scripts.dtensor_plans

For gpt2 (whose plan is gpt's: tests/test_plan_dtensor.py and Lesson 7's tests run gpt) and
llama (RMSNorm, RoPE, SwiGLU's gate/up/down), both plans derived from the architecture's
sharding plan: tensor parallelism (gpt.dtensor_plan) and tensor + sequence parallelism
(sequence_parallel.dtensor_plan), each with the vocabulary replicated and sharded
(loss_parallel). A tiny GPT trains STEPS float64 AdamW steps next to the single-device GPT on
the same batches; every loss and every parameter's gradient is compared under the tolerance
policy (assert_matches_reference). Prints "check <plan> <arch> <vocab>: ok" per run on rank 0;
exits 1 if any differs.

Then, in the same launch, Lesson 7's report (sequence_parallel.dtensor_plan.report): gpt's SP plan
against one device and its collectives counted next to ours, ``--write JSON`` the counts.
"""
import argparse
import copy
import sys
import traceback

import torch
import torch.distributed as dist

from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.comm.process_group import exit_now
from tp_from_scratch.gpt.data import global_batch
from tp_from_scratch.gpt.dtensor_plan import loss_context, parallelize_gpt, parallelize_gpt_vocab
from tp_from_scratch.comm.process_group import init_process_group
from tp_from_scratch.gpt.mesh import setup_mesh
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.sequence_parallel.dtensor_plan import parallelize_gpt_sp, report

STEPS = 2
ARCHS = ("gpt2", "llama")
PLANS = {  # name -> (parallelize(gpt, mesh), vocabulary sharded)
    "tp": (parallelize_gpt, False),
    "tp+vocab": (parallelize_gpt_vocab, True),
    "sp": (parallelize_gpt_sp, False),
    "sp+vocab": (lambda gpt, mesh: parallelize_gpt_sp(gpt, mesh, vocab_parallel=True), True),
}


def full(t):
    """A DTensor's global value (a plain tensor is already whole on every rank)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def check(arch, plan, mesh, rank):
    # 67 is prime: the vocabulary splits unevenly over 2 ranks
    config = GPTConfig(arch=arch, vocab_size=67, seq_len=8, n_layers=2, hidden=32, n_heads=4, n_kv_heads=2)
    parallelize, vocab_parallel = PLANS[plan]
    single = init_gpt(config, 0, torch.float64)
    parallel = parallelize(copy.deepcopy(single), mesh)
    models = {"single": single, "dtensor": parallel}
    optimizers = {k: torch.optim.AdamW(m.parameters(), lr=3e-3) for k, m in models.items()}
    for step in range(STEPS):
        x, y = global_batch(step, 4, config.seq_len, config.vocab_size, seed=1)  # the same batch on every rank
        losses = {}
        for name, model in models.items():
            optimizers[name].zero_grad()
            with loss_context(vocab_parallel and name == "dtensor"):
                _, loss = model(x, y)
                loss.backward()
            losses[name] = full(loss.detach())
        where = f"{plan} {arch} step {step}"
        assert_matches_reference(losses["dtensor"], losses["single"], name=f"loss ({where})", rank=rank)
        grads = dict(parallel.named_parameters())
        for name, p in single.named_parameters():
            assert_matches_reference(full(grads[name].grad), p.grad, name=f"grad of {name} ({where})", rank=rank)
        for optimizer in optimizers.values():
            optimizer.step()


def main():
    parser = argparse.ArgumentParser(prog="python -m tests.spmd_scripts.dtensor_plans")
    parser.add_argument("--write", metavar="JSON", help="Lesson 7's collective counts, written here")
    args = parser.parse_args()
    init_process_group("cpu")   # torch_main's start, without its exit: this script exits itself
    mesh = setup_mesh(2, dtensor=True)
    failures = 0
    try:
        for arch in ARCHS:
            for plan in PLANS:
                try:
                    check(arch, plan, mesh.device_mesh["tp"], mesh.rank)
                    verdict = "ok"
                except Exception:  # every rank runs every check: the collectives stay in step
                    verdict = "DIFFERS\n" + traceback.format_exc()
                    failures += 1
                if mesh.rank == 0:
                    print(f"check {plan} {arch}: {verdict}", flush=True)
        report(mesh, args.write)
    finally:
        dist.destroy_process_group()
    exit_now(1 if failures else 0)


if __name__ == "__main__":
    sys.exit(main())
