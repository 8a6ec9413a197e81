"""Demo: one pre-LN transformer block, forward and backward, split across the ranks of a job.

    .venv/bin/mpiexec -n 4 .venv/bin/python -m tp_from_scratch.demos.transformer_block
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.demos.transformer_block
    .venv/bin/python -m tp_from_scratch.demos.transformer_block --simulate 4     # 4 ranks as threads

Every rank builds the same full (single-device) parameters, keeps only its shard, runs the
numpy tensor-parallel block (tp_from_scratch.layers.block) forward and backward, and checks
the output and every gradient against the single-device reference. Rank 0 prints:
  1. the verdict for each tensor (largest error, under compare.assert_matches_reference);
  2. each rank's parameter memory: the split weights take 1/t, the replicated ones do not;
  3. the communication table from the meter, beside the theory 4 x 2(t-1)/t x B*T*H x itemsize.
A mismatch on any rank ends the job with a non-zero status naming the rank.
"""
import argparse
import sys

import numpy as np

from tp_from_scratch.collectives import all_gather
from tp_from_scratch.gpt.arch import KV_COLWISE, module_style, shard_axis
from tp_from_scratch.layers import block, check
from tp_from_scratch.layers import reference as ref
from tp_from_scratch.testing import random_array, rank_rng


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=2, help="B")
    parser.add_argument("--seq", type=int, default=8, help="T")
    parser.add_argument("--hidden", type=int, default=64, help="H")
    parser.add_argument("--heads", type=int, default=8, help="query heads nh")
    parser.add_argument("--kv-heads", type=int, default=4, help="key/value heads nkv (GQA)")
    parser.add_argument("--ffn", type=int, default=256, help="F, usually 4H")
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--simulate", type=int, metavar="T", default=None,
                        help="run T ranks as threads in this process instead of under a launcher")
    args = parser.parse_args(argv)
    for name in ("batch", "seq", "hidden", "heads", "kv_heads", "ffn"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.simulate is not None and args.simulate < 1:
        parser.error(f"--simulate needs at least 1 rank, got {args.simulate}")
    return args


def parameter_groups(config, tp, keys):
    """Block param ``keys`` by how they are stored, as the GPT's sharding plan says (gpt.arch;
    the numpy block has the torch Block's names): split 1/t, KV heads copied (KV_COLWISE with
    fewer KV heads than ranks), or replicated."""
    groups = {"split 1/t": set(), "KV copies": set(), "replicated": set()}
    for key in keys:
        name = f"blocks.0.{key}"
        if shard_axis(name, "gpt") is None:
            groups["replicated"].add(key)
        elif module_style(name.rpartition(".")[0], "gpt") == KV_COLWISE and config.n_kv_heads < tp:
            groups["KV copies"].add(key)
        else:
            groups["split 1/t"].add(key)
    return {name: keys for name, keys in groups.items() if keys}


def run(comm, args):
    """The demo on one rank; returns this rank's verdicts (raises if any tensor mismatches)."""
    t, rank = comm.world_size, comm.rank
    dtype = np.dtype(args.dtype)
    config = ref.BlockConfig(args.hidden, args.heads, args.kv_heads, args.ffn)
    # the same full params, x and dy on every rank: Replicated data must agree everywhere
    rng = rank_rng(args.seed)
    params = ref.init_block_params(rng, config, dtype)
    shape = (args.batch, args.seq, args.hidden)  # (B, T, H)
    x, dy = random_array(rng, shape, dtype), random_array(rng, shape, dtype)
    local = block.shard_block_params(params, config, t, rank)

    # the parallel block: the meter sees exactly one forward and one backward
    comm.meter.reset()
    y, cache = block.parallel_block_forward(comm, x, local, config)
    dx, grads = block.parallel_block_backward(comm, dy, cache)
    table = comm.meter.table()
    sent = comm.meter.by_collective["all_reduce"].bytes_sent

    # the single-device reference, and the comparison
    y_ref, ref_cache = ref.block_forward(x, params, config)
    dx_ref, grads_ref = ref.block_backward(dy, ref_cache)
    verdicts = []
    check.compare(verdicts, y, y_ref, "output", rank)
    check.compare(verdicts, dx, dx_ref, "grad of x", rank)
    full_grads = block.gather_block_grads(check.all_ranks(comm, grads), config)
    for key in grads_ref:
        check.compare(verdicts, full_grads[key], grads_ref[key], f"grad of {key}", rank)

    # per-rank parameter memory, by storage group, gathered to every rank to print on rank 0
    groups = parameter_groups(config, t, params)
    mine = np.array([sum(local[k].nbytes for k in keys) for keys in groups.values()])
    every = all_gather(comm, mine[None], axis=0)  # (t, groups)
    verdict_ok = all_gather(comm, np.array([all(v.ok for v in verdicts)]), axis=0)

    if rank == 0:
        full = [sum(params[k].nbytes for k in keys) for keys in groups.values()]
        report(args, config, t, verdicts, groups, full, every, table, sent, verdict_ok)
    check.raise_mismatches(verdicts)
    return verdicts


def report(args, config, t, verdicts, groups, full, every, table, sent, verdict_ok):
    """Rank 0's printout: verdicts, memory per rank, communication against theory."""
    B, T, H = args.batch, args.seq, args.hidden
    itemsize = np.dtype(args.dtype).itemsize
    print(f"Pre-LN transformer block, B={B} T={T} H={H} heads={config.n_heads} "
          f"kv_heads={config.n_kv_heads} F={config.ffn}, {args.dtype}, t={t} ranks\n")
    print("1. Parallel vs single-device reference (rank 0; every rank checks its own):")
    for v in verdicts:
        print(f"   {v}")
    ranks_ok = "all ranks" if verdict_ok.all() else f"ranks {np.flatnonzero(~verdict_ok).tolist()} FAIL"
    print(f"   -> {sum(v.ok for v in verdicts)}/{len(verdicts)} tensors match on rank 0; {ranks_ok}\n")

    print("2. Parameter memory per rank, in bytes:")
    names = list(groups)
    print("   " + "".ljust(8) + "".join(n.rjust(12) for n in names) + "total".rjust(12))
    rows = [("full", full)] + [(f"rank {r}", [int(b) for b in row]) for r, row in enumerate(every)]
    for label, row in rows:
        print("   " + label.ljust(8) + "".join(str(b).rjust(12) for b in row) + str(sum(row)).rjust(12))
    split = names.index("split 1/t")
    print(f"   split 1/t:  q, o, fc, proj weights (and k, v when t divides nkv) and the column biases;"
          f" {int(every[0][split])} = {full[split]} / {t} on each rank")
    if "KV copies" in groups:
        print(f"   KV copies:  {config.n_kv_heads} KV heads < t={t}: each rank holds the one its query"
              f" heads read, so each KV head is stored on t/nkv = {t // config.n_kv_heads} ranks")
    print("   replicated: LayerNorm weights and biases, and the biases added after an all-reduce"
          " (attn.o.bias, mlp.proj.bias)\n")

    theory = 4 * 2 * (t - 1) * B * T * H * itemsize / t
    print("3. Communication of one forward + backward (rank 0's meter):")
    print("   " + table.replace("\n", "\n   "))
    print(f"   theory: 4 all-reduces x 2(t-1)/t x B*T*H x {itemsize} bytes = {theory:.0f} bytes sent per rank;"
          f" measured {sent}")


def main(argv=None):
    args = parse_args(argv)
    from tp_from_scratch.comm import run_spmd, spmd_main
    from tp_from_scratch.comm.launch import launcher_from_env
    if args.simulate is None and launcher_from_env() is None:
        print("Not started by mpiexec or torchrun: simulating 4 ranks as threads (--simulate 4).\n"
              "For real processes: mpiexec -n 4 python -m tp_from_scratch.demos.transformer_block\n",
              flush=True)
        args.simulate = 4
    if args.simulate is not None:
        run_spmd(run, args.simulate, args)
    else:
        spmd_main(lambda comm: run(comm, args))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
