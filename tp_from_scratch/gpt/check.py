"""Check the tensor-parallel GPT against the single-device GPT, on simulated ranks or under torchrun.

    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.gpt.check [--dtype float64 ...]
    run_spmd(4, lambda comm: check_config(comm, config, torch.float64))   # in one process

Every rank builds the same single-device GPT (same seed), converts it to its TP shard, and
runs one forward and backward on the same batch. Then, against the single-device model:
the gathered logits, the loss, the gathered gradient of every parameter, the parameters
after one SGD step, and the round trip TP -> single-device state dict must all match
(compare.assert_matches_reference). Prints "model checks passed" on rank 0.
"""
import argparse
from dataclasses import replace

import torch
import torch.distributed as dist

from tp_from_scratch.comm.launch import torch_main
from tp_from_scratch.comm.torch_comm import TorchComm
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.gpt import optim
from tp_from_scratch.gpt.data import global_batch
from tp_from_scratch.gpt.arch import shard_axis
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.parallelize import gather_state_dict, gpt_to_tp, tp_to_gpt
from tp_from_scratch.nn import gather_from_tp_region, tp_rank, tp_world_size

# V = 67 splits unevenly at every tp > 1; nh / nkv = 2 is grouped-query attention
BASE = GPTConfig(vocab_size=67, seq_len=16, n_layers=2, hidden=32, n_heads=8, n_kv_heads=4, ffn=64)


# the two published architectures on the same sizes: GPT-2 (multi-head, all biases with the
# key bias, tanh GeLU) and Llama (RMSNorm, RoPE, SwiGLU, no biases; 2 KV heads: replicated at t=4)
GPT2 = GPTConfig(arch="gpt2", vocab_size=67, seq_len=16, n_layers=2, hidden=32, n_heads=8, n_kv_heads=8, ffn=64)
LLAMA = GPTConfig(arch="llama", vocab_size=67, seq_len=16, n_layers=2, hidden=32, n_heads=8, n_kv_heads=2,
                  ffn=64)

# heads, KV heads and FFN widths that t does not divide (gpt.arch.head_counts, split_sizes): GPT-2
# with 52 heads (7, 7, 7, 7, 6, 6, 6, 6 at t = 8; 18, 17, 17 at t = 3) and FFN 100; Llama with 20
# query heads on 4 KV heads (10, 5, 5 query heads on 2, 1, 1 KV heads at t = 3; at t = 8 each KV
# head held by 2 ranks, which split its 5 query heads 3 and 2) and FFN 50
UNEVEN_GPT2 = GPTConfig(arch="gpt2", vocab_size=67, seq_len=12, n_layers=2, hidden=104, n_heads=52, n_kv_heads=52,
                        ffn=100)
UNEVEN_LLAMA = GPTConfig(arch="llama", vocab_size=67, seq_len=12, n_layers=2, hidden=80, n_heads=20, n_kv_heads=4,
                         ffn=50)


def configs_for(tp):
    """The configs checked at TP degree tp: tied and untied head, one KV head (replicated
    on every rank when tp > 1) in the tanh-GeLU form of the numpy lessons, GPT-2 and Llama."""
    configs = [BASE, replace(BASE, tie_embeddings=False), replace(BASE, n_kv_heads=1, gelu="tanh"),
               GPT2, LLAMA]
    return [c for c in configs if _valid(c, tp)]


def _valid(config, tp):
    try:
        config.validate(tp)
        return True
    except ValueError:
        return False


def check_config(group, config, dtype, seed=0):
    """Run every check for one config on the ranks of ``group`` (a ProcessGroup or a Comm).

    Raises AssertionError on a mismatch.
    """
    rank = tp_rank(group)
    single = init_gpt(config, seed, dtype)
    tp_model = gpt_to_tp(group, single)
    x, y = global_batch(seed, 4, config.seq_len, config.vocab_size, seed)  # (B, T) each

    logits, loss = single(x, y)
    loss.backward()
    local_logits, tp_loss = tp_model(x, y)
    tp_loss.backward()

    # the loss is replicated; the logits are Sharded(vocab): gather them to compare
    assert_matches_reference(tp_loss, loss, name="loss", rank=rank)
    sizes = tp_model.wte.vocab_sizes
    assert_matches_reference(gather_from_tp_region(group, local_logits.detach(), sizes), logits,
                             name="logits", rank=rank)
    grads = gather_state_dict(group, {n: p.grad for n, p in tp_model.named_parameters()}, config)
    local = dict(tp_model.named_parameters())
    for name, p in single.named_parameters():
        assert_matches_reference(grads[name], p.grad, name=f"grad of {name}", rank=rank)
        if shard_axis(name) is None:  # replicated: every rank must hold the full gradient itself
            assert_matches_reference(local[name].grad, p.grad, name=f"local grad of {name}", rank=rank)

    # one optimizer step on each side: element-wise, so each shard follows its full tensor.
    # SGD, not Adam: Adam's first step is lr * g / (|g| + eps), about lr * sign(g), which
    # turns the roundoff in a near-zero gradient into a full-size step (see train.py)
    for model in (single, tp_model):
        opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        opt.step()
    stepped = tp_to_gpt(tp_model).state_dict()
    for name, p in single.state_dict().items():
        assert_matches_reference(stepped[name], p, name=f"{name} after one SGD step", rank=rank)


def check_generation(group, config, dtype, seed=0):
    """Greedy and seeded-sampled token ids of the TP model (KV cache sharded by heads) equal
    the single-device model's, on every rank."""
    from tp_from_scratch.gpt.generate import generate
    single = init_gpt(config, seed, dtype).eval()
    tp_model = gpt_to_tp(group, single).eval()
    prompt = torch.randint(config.vocab_size, (2, 4), generator=torch.Generator().manual_seed(seed))
    for kw in (dict(), dict(sample=True, seed=seed, top_k=10)):
        ids = generate(tp_model, prompt, config.seq_len - 4, **kw)
        want = generate(single, prompt, config.seq_len - 4, **kw)
        if not torch.equal(ids, want):
            raise AssertionError(f"generated ids on rank {tp_rank(group)} ({config.arch}, {kw or 'greedy'}): "
                                 f"{ids.tolist()}, single device {want.tolist()}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=["float32", "float64"], nargs="+", default=["float64", "float32"])
    args = parser.parse_args(argv)
    torch_main(lambda: check_all(args.dtype))


def check_all(dtypes):
    """Every check on the world group (native collectives), one on a TorchComm over it (the ring
    collectives), then generation; rank 0 prints a line each."""
    world = dist.group.WORLD
    tp = tp_world_size(world)
    for dtype in dtypes:
        for config in configs_for(tp):
            check_config(world, config, getattr(torch, dtype))
        if dist.get_rank() == 0:
            print(f"model checks passed (tp={tp}, {dtype}, native collectives, tied and untied "
                  f"head, nkv=1, gpt2, llama)", flush=True)
    check_config(TorchComm(world), BASE, torch.float64)  # the same model on the ring collectives
    if dist.get_rank() == 0:
        print(f"model checks passed (tp={tp}, float64, from-scratch collectives)", flush=True)
    for config in (c for c in (BASE, LLAMA) if _valid(c, tp)):
        check_generation(world, config, torch.float32)
    if dist.get_rank() == 0:
        print(f"generation checks passed (tp={tp}, float32, greedy and sampled, gpt and llama)", flush=True)

if __name__ == "__main__":
    main()
