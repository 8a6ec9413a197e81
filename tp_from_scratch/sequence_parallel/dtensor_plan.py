"""PyTorch's own sequence parallelism (DTensor) on the same GPT, to compare with ours.

    blocks.0                 PrepareModuleInput   Replicate -> Shard(1): enter the region (a local split)
    blocks.i.ln1, ln2        SequenceParallel     the norm on Shard(1); weights Replicate, grads Partial
    blocks.i.attn, mlp       PrepareModuleInput   Shard(1) -> Replicate: the paper's g (all-gather)
    attn.q/k/v, mlp.fc       ColwiseParallel      W[out_t, in]   (llama: mlp.gate, mlp.up)
    attn.o, mlp.proj         RowwiseParallel      output Shard(1): the paper's g-bar (reduce-scatter)
                                                  (llama: mlp.down)
    blocks.{L-1}             PrepareModuleOutput  Shard(1) -> Replicate: leave the region (all-gather)

The block entries come from the architecture's sharding plan (gpt.arch.PLANS), so gpt, gpt2
and llama (RMSNorm, RoPE, SwiGLU) are all covered.

The embeddings, the final LayerNorm and the LM head stay replicated (ours shards the
vocabulary), or with vocab_parallel=True are sharded as ours are, the loss under loss_parallel. Run it against one device, and count its collectives with torch's CommDebugMode
next to ours (gpt.traffic.CollectiveCounter), with
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.sequence_parallel.dtensor_plan \
        [--write lessons/measurements/sp_collectives.json]
The trainer runs the plan with `.venv/bin/python -m tp_from_scratch.sequence_parallel.train --impl dtensor`.
Note: gloo has no reduce-scatter of its own; torch emulates it with an all-reduce, so on CPU
DTensor moves twice the bytes our ring reduce-scatter does (Lesson 7 measures ours).
"""
import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleInputOutput,
                                               PrepareModuleOutput, RowwiseParallel, SequenceParallel,
                                               parallelize_module)

from tp_from_scratch.gpt.arch import COLWISE, KV_COLWISE, REPLICATED, ROWWISE, plan_modules
from tp_from_scratch.gpt.dtensor_plan import check_plannable, vocab_plan


def sp_plan(config):
    """{module path: parallel style} for tensor + sequence parallelism of every block, derived
    from the architecture's sharding plan (gpt.arch.PLANS): its REPLICATED block modules (the
    norms) become SequenceParallel, COLWISE and KV_COLWISE ColwiseParallel, ROWWISE
    RowwiseParallel to Shard(1); the modules holding column layers (attn, mlp) gather the
    sequence on entry."""
    L = config.n_layers
    # blocks and attention are called as (x, cache): the KV cache (None in training) is left alone
    plan = {"blocks.0": PrepareModuleInput(input_layouts=(Replicate(), None),
                                           desired_input_layouts=(Shard(1), None), use_local_output=True)}
    styles = {REPLICATED: SequenceParallel, COLWISE: ColwiseParallel, KV_COLWISE: ColwiseParallel,
              ROWWISE: lambda: RowwiseParallel(output_layouts=Shard(1))}
    for ours, make in styles.items():
        for name in plan_modules(config.arch, ours, L):
            if name.startswith("blocks."):
                plan[name] = make()
    for name in plan_modules(config.arch, COLWISE, L):  # blocks.i.attn, blocks.i.mlp: gather T on entry
        parent = name.rsplit(".", 1)[0]
        extra = (None,) if parent.endswith(".attn") else ()  # attention's cache argument
        plan[parent] = PrepareModuleInput(input_layouts=(Shard(1), *extra), desired_input_layouts=(Replicate(), *extra),
                                          use_local_output=True)
    leave = dict(output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),), use_local_output=True)
    if L == 1:  # one block both enters and leaves the region: one style doing both
        plan["blocks.0"] = PrepareModuleInputOutput(input_layouts=(Replicate(), None),
                                                    desired_input_layouts=(Shard(1), None), use_local_input=True,
                                                    **leave)
    else:
        plan[f"blocks.{L - 1}"] = PrepareModuleOutput(**leave)
    return plan


def parallelize_gpt_sp(gpt, tp_mesh, vocab_parallel=False):
    """Shard a single-device GPT (the same weights on every rank) over a 1-D DeviceMesh, in place.

    vocab_parallel: also shard the embedding and the LM head by vocabulary as ours does (Lesson
    9's gpt.dtensor_plan.vocab_plan entries for wte, ln_f and lm_head); forward and backward
    must then run inside gpt.dtensor_plan.loss_context(True) (loss_parallel).
    """
    check_plannable(gpt.config, tp_mesh.size())
    plan = sp_plan(gpt.config)
    if vocab_parallel:
        plan.update({name: style for name, style in vocab_plan(gpt.config).items()
                     if not name.startswith("blocks.")})
    return parallelize_module(gpt, tp_mesh, plan)


def compare_with_single_device(mesh, steps=5, seed=0, vocab_parallel=False):
    """Train the DTensor SP GPT and the single-device GPT side by side (float64, the trainer's
    default GPT and batches); return the largest |loss difference| over ``steps`` steps."""
    import copy

    from functools import partial

    from tp_from_scratch.gpt.data import global_batch
    from tp_from_scratch.gpt.dtensor_plan import loss_context
    from tp_from_scratch.gpt.model import GPTConfig, init_gpt
    from tp_from_scratch.gpt.step import train_step

    config = GPTConfig()
    single = init_gpt(config, seed, torch.float64)
    parallel = parallelize_gpt_sp(copy.deepcopy(single), mesh, vocab_parallel)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=3e-3) for m in (single, parallel)]
    worst = 0.0
    for step in range(steps):
        x, y = global_batch(step, 8, config.seq_len, config.vocab_size, seed)
        losses = []
        for model, optimizer in zip((single, parallel), optimizers):
            # Lesson 6's step; the vocab-sharded plan's forward and backward run inside loss_parallel
            loss = train_step(model, optimizer, x, y, context=partial(loss_context, vocab_parallel and model is parallel))
            losses.append(loss.full_tensor().item() if hasattr(loss, "full_tensor") else loss.item())
        worst = max(worst, abs(losses[0] - losses[1]))
    return worst


KINDS = (("all_gather", "all-gather"), ("reduce_scatter", "reduce-scatter"), ("all_reduce", "all-reduce"))


def kind(name):
    """'all-gather' / 'reduce-scatter' / 'all-reduce' for a collective's name in either counter
    (torch.distributed's all_gather, reduce_scatter_single, ...; DTensor's functional
    all_gather_into_tensor, reduce_scatter_tensor, ...); the name itself otherwise."""
    return next((label for key, label in KINDS if key in name), name)


def by_kind(calls):
    """{kind: calls} from (collective name, calls) pairs."""
    totals = {}
    for name, n in calls:
        totals[kind(name)] = totals.get(kind(name), 0) + n
    return totals


def count_collectives(mesh, seed=0):
    """Calls per collective in one forward and one backward of the trainer's default GPT (B=8):
    {"ours": {"forward": {...}, "backward": {...}}, "dtensor": {...}}. Ours (SequenceParallelGPT
    on the mesh's native TP group) counted by gpt.traffic.CollectiveCounter, DTensor's by
    torch.distributed.tensor.debug.CommDebugMode."""
    import copy

    from torch.distributed.tensor.debug import CommDebugMode

    from tp_from_scratch.gpt.data import global_batch
    from tp_from_scratch.gpt.model import GPTConfig, init_gpt
    from tp_from_scratch.gpt.traffic import CollectiveCounter
    from tp_from_scratch.sequence_parallel.model import gpt_to_sp

    config = GPTConfig()
    single = init_gpt(config, seed, torch.float64)
    x, y = global_batch(0, 8, config.seq_len, config.vocab_size, seed)
    counts = {}
    ours = gpt_to_sp(mesh.get_group(), single)
    forward, backward = CollectiveCounter(), CollectiveCounter()
    with forward.counting():
        _, loss = ours(x, y)
    with backward.counting():
        loss.backward()
    counts["ours"] = {d: by_kind((name, n) for (name, _group), n in c.calls.items())
                      for d, c in (("forward", forward), ("backward", backward))}
    theirs = parallelize_gpt_sp(copy.deepcopy(single), mesh)
    with CommDebugMode() as forward:
        _, loss = theirs(x, y)
    with CommDebugMode() as backward:
        loss.backward()
    counts["dtensor"] = {d: by_kind((str(op), n) for op, n in mode.get_comm_counts().items())
                         for d, mode in (("forward", forward), ("backward", backward))}
    # DTensor does not sum the LayerNorm weights' Partial gradients in backward: they stay
    # Partial until an operation (the optimizer step) needs them Replicate
    counts["dtensor_partial_gradients_after_backward"] = sorted(
        name for name, param in theirs.named_parameters()
        if any(placement.is_partial() for placement in getattr(param.grad, "placements", ())))
    return {"config": {"layers": config.n_layers, "hidden": config.hidden, "heads": config.n_heads,
                       "kv_heads": config.n_kv_heads, "vocab": config.vocab_size, "seq_len": config.seq_len,
                       "batch": 8, "tp": mesh.size(), "dtype": "float64"},
            "command": ".venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.sequence_parallel.dtensor_plan "
                       "--write lessons/measurements/sp_collectives.json",
            **counts}


def report(mesh, write=None):
    """Rank 0 prints the plan against one device (with and without the vocabulary sharded) and
    the collectives of both versions; ``write``: the counts as JSON too. Every rank calls it."""
    import json

    tp_mesh = mesh.device_mesh["tp"]
    worst = compare_with_single_device(tp_mesh)
    worst_vocab = compare_with_single_device(tp_mesh, vocab_parallel=True)
    counts = count_collectives(tp_mesh)
    if mesh.rank == 0:
        print(f"DTensor sequence parallel, tp={mesh.tp}: largest |loss - single-device loss| over 5 "
              f"float64 steps {worst:.1e}")
        print(f"DTensor sequence parallel + vocabulary-sharded head and loss_parallel, tp={mesh.tp}: "
              f"largest |loss - single-device loss| over 5 float64 steps {worst_vocab:.1e}")
        for direction in ("forward", "backward"):
            for who in ("ours", "dtensor"):
                print(f"collectives in one {direction}, {who:<7}: {counts[who][direction]}")
        if write:
            with open(write, "w") as f:
                json.dump(counts, f, indent=1, sort_keys=True)
                f.write("\n")
            print(f"counts written to {write}")


def main(argv=None):
    import argparse
    import os

    from tp_from_scratch.comm.launch import torch_main
    from tp_from_scratch.gpt.mesh import setup_mesh

    parser = argparse.ArgumentParser(prog="python -m tp_from_scratch.sequence_parallel.dtensor_plan")
    parser.add_argument("--write", metavar="JSON", help="also write the collective counts to this file")
    args = parser.parse_args(argv)
    # every rank in one TP group
    torch_main(lambda: report(setup_mesh(int(os.environ["WORLD_SIZE"]), dtensor=True), args.write))

if __name__ == "__main__":
    main()
