"""PyTorch's own sequence parallelism (DTensor) on the same GPT, to compare with ours.

    blocks.0                 PrepareModuleInput   Replicate -> Shard(1): enter the region (a local split)
    blocks.i.ln1, ln2        SequenceParallel     LayerNorm on Shard(1); weights Replicate, grads Partial
    blocks.i.attn, mlp       PrepareModuleInput   Shard(1) -> Replicate: the paper's g (all-gather)
    attn.q/k/v, mlp.fc       ColwiseParallel      W[out_t, in]
    attn.o, mlp.proj         RowwiseParallel      output Shard(1): the paper's g-bar (reduce-scatter)
    blocks.{L-1}             PrepareModuleOutput  Shard(1) -> Replicate: leave the region (all-gather)

The embeddings, the final LayerNorm and the LM head stay replicated (ours shards the
vocabulary). Run it, and count its collectives with torch's CommDebugMode, with
    torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.sequence_parallel.dtensor_plan
Note: gloo has no reduce-scatter of its own; torch emulates it with an all-reduce, so on CPU
DTensor moves twice the bytes our ring reduce-scatter does (Lesson 7 measures ours).
"""
import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                               RowwiseParallel, SequenceParallel, parallelize_module)


def sp_plan(n_layers):
    """{module path: parallel style} for tensor + sequence parallelism of every block."""
    # blocks and attention are called as (x, cache): the KV cache (None in training) is left alone
    plan = {"blocks.0": PrepareModuleInput(input_layouts=(Replicate(), None),
                                           desired_input_layouts=(Shard(1), None), use_local_output=True)}
    for i in range(n_layers):
        b = f"blocks.{i}"
        plan[f"{b}.ln1"] = SequenceParallel()
        plan[f"{b}.ln2"] = SequenceParallel()
        plan[f"{b}.attn"] = PrepareModuleInput(input_layouts=(Shard(1), None),
                                               desired_input_layouts=(Replicate(), None), use_local_output=True)
        plan[f"{b}.mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                              use_local_output=True)
        for name in ("attn.q", "attn.k", "attn.v", "mlp.fc"):
            plan[f"{b}.{name}"] = ColwiseParallel()
        for name in ("attn.o", "mlp.proj"):
            plan[f"{b}.{name}"] = RowwiseParallel(output_layouts=Shard(1))
    last = f"blocks.{n_layers - 1}"
    plan[last] = PrepareModuleOutput(output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),),
                                     use_local_output=True)
    return plan


def parallelize_gpt_sp(gpt, tp_mesh):
    """Shard a single-device GPT (the same weights on every rank) over a 1-D DeviceMesh, in place."""
    if gpt.config.arch != "gpt":
        raise ValueError(f"the DTensor sequence-parallel plan covers arch 'gpt', not {gpt.config.arch!r}")
    return parallelize_module(gpt, tp_mesh, sp_plan(gpt.config.n_layers))


def compare_with_single_device(mesh, steps=5, seed=0):
    """Train the DTensor SP GPT and the single-device GPT side by side (float64); return
    (max |loss difference|, {"forward"/"backward": {collective: calls}} of the first step,
    counted by CommDebugMode)."""
    import copy

    from torch.distributed.tensor.debug import CommDebugMode

    from tp_from_scratch.gpt.data import global_batch
    from tp_from_scratch.gpt.model import GPTConfig, init_gpt

    config = GPTConfig()
    single = init_gpt(config, seed, torch.float64)
    parallel = parallelize_gpt_sp(copy.deepcopy(single), mesh)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=3e-3) for m in (single, parallel)]
    worst, counts = 0.0, None
    for step in range(steps):
        x, y = global_batch(step, 8, config.seq_len, config.vocab_size, seed)
        losses = []
        for model, optimizer in zip((single, parallel), optimizers):
            optimizer.zero_grad()
            if model is parallel and step == 0:  # count forward and backward apart
                with CommDebugMode() as forward:
                    _, loss = model(x, y)
                with CommDebugMode() as backward:
                    loss.backward()
                counts = {direction: {str(k).split(".")[-1]: v for k, v in mode.get_comm_counts().items()}
                          for direction, mode in (("forward", forward), ("backward", backward))}
            else:
                _, loss = model(x, y)
                loss.backward()
            optimizer.step()
            losses.append(loss.item())
        worst = max(worst, abs(losses[0] - losses[1]))
    return worst, counts


def main():
    import os

    import torch.distributed as dist

    from tp_from_scratch.gpt.mesh import setup_mesh

    mesh = setup_mesh(int(os.environ["WORLD_SIZE"]), dtensor=True)  # every rank in one TP group
    try:
        worst, counts = compare_with_single_device(mesh.device_mesh["tp"])
        if mesh.rank == 0:
            print(f"DTensor sequence parallel, tp={mesh.tp}: largest |loss - single-device loss| over 5 "
                  f"float64 steps {worst:.1e}")
            for direction, calls in counts.items():
                print(f"collectives in one {direction} (CommDebugMode): {calls}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
