"""Training-step time: tp_from_scratch's TP GPT against PyTorch's own TP (DTensor), same model.

    torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.bench train [--tp 2] [--hidden 128]

Both versions start from the same single-device weights and train on the same batches.
Rounds alternate, scratch then dtensor, so that whatever else the machine is doing falls
on both alike; each round times ``--steps-per-round`` full steps (forward, backward,
AdamW) after ``--warmup`` untimed ones. Prints the median step time of each and the ratio
scratch / dtensor (below 1.0: ours is faster). Here world size = tp (no data parallelism).
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist

from tp_from_scratch.comm.process_group import init_process_group
from tp_from_scratch.gpt.data import global_batch
from tp_from_scratch.gpt.model import GPTConfig, gpt_to_tp, init_gpt


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m tp_from_scratch.bench train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab-size", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps-per-round", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--collectives", choices=["native", "scratch"], default="native",
                   help="collectives under tp_from_scratch's layers")
    p.add_argument("--timeout", type=float, default=120.0)
    return p.parse_args(argv)


def timed_steps(model, optimizer, batches):
    """Seconds per step over ``batches`` (a barrier before and after, so all ranks agree)."""
    dist.barrier()
    t0 = time.perf_counter()
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
    dist.barrier()
    return (time.perf_counter() - t0) / len(batches)


def main(argv=None):
    args = parse(argv)
    init_process_group("cpu", args.timeout)
    try:
        return run(args)
    finally:
        dist.destroy_process_group()


def run(args):
    from torch.distributed.device_mesh import init_device_mesh

    from tp_from_scratch.comm.torch_comm import TorchComm
    from tp_from_scratch.gpt.dtensor_plan import parallelize_gpt

    tp, rank = dist.get_world_size(), dist.get_rank()
    config = GPTConfig(vocab_size=args.vocab_size, seq_len=args.seq_len, n_layers=args.layers,
                       hidden=args.hidden, n_heads=args.heads, n_kv_heads=args.kv_heads)
    config.validate(tp)
    world = dist.group.WORLD
    group = world if args.collectives == "native" else TorchComm(world, timeout=args.timeout)
    models = {"scratch": gpt_to_tp(group, init_gpt(config, 0)),
              "dtensor": parallelize_gpt(init_gpt(config, 0), init_device_mesh("cpu", (tp,)))}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=False) for k, m in models.items()}
    batches = [global_batch(s, args.batch_size, config.seq_len, config.vocab_size, 0)
               for s in range(args.steps_per_round)]
    times = {k: [] for k in models}
    for name in models:
        timed_steps(models[name], opts[name], batches[:args.warmup])
    for _ in range(args.rounds):
        for name in models:  # alternate: scratch, dtensor, scratch, dtensor, ...
            times[name].append(timed_steps(models[name], opts[name], batches))
    if rank == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"GPT H={config.hidden} layers={config.n_layers} nh={config.n_heads} "
              f"nkv={config.n_kv_heads} T={config.seq_len} V={config.vocab_size} B={args.batch_size}, "
              f"tp={tp}, CPU/gloo, {args.rounds} rounds x {args.steps_per_round} steps")
        for k, v in med.items():
            spread = f"{min(times[k]) * 1e3:.1f}..{max(times[k]) * 1e3:.1f}"
            label = f"{k} ({args.collectives} collectives)" if k == "scratch" else k
            print(f"  {label:<30} median {v * 1e3:8.2f} ms/step  (rounds {spread} ms)")
        print(f"  ratio scratch / dtensor: {med['scratch'] / med['dtensor']:.2f}x "
              f"(target <= 1.0)")
    return 0
