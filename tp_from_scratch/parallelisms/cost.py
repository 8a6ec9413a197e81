"""The cost model of one training step on a dp x pp x tp mesh: memory and bytes per rank.

Lesson 9's planner (tp_from_scratch.cost, on Lesson 6's gpt.inventory) counts the parameters of every tensor, what
TP splits, and the collectives of a tp x dp step. This module extends it, by formula, to
what Lesson 11 adds, for a rank at mesh coordinates (dp_rank, pp_rank, tp_rank):

* a pipeline stage holds its blocks (numpy.array_split of the L layers over p stages), the
  embeddings on the first stage and the final norm and LM head on the last (the tied
  embedding is kept on both: the last stage's copy is the LM head);
* ZeRO: the optimizer state of ceil(N/dp) of the stage's N parameters, plus the flat copy of
  those the update runs on; ZeRO-2 keeps only that chunk's gradient after the step;
* bytes: what the rank hands to torch.distributed's collectives (the payload the trainer's
  CollectiveCounter counts: for an all-gather this rank's piece, for reduce_scatter the
  piece it receives), and what it sends point to point in the pipeline (the Comm's meter).

Activations are not predicted here: cost.model.activation_bytes is Korthikanti et al.'s formula
for 16-bit activations with dropout; the comparison prints it beside our measured count of
the bytes autograd keeps, which is neither (float32, no dropout).
"""
from dataclasses import replace

from tp_from_scratch.gpt.inventory import collective_calls, parameters
from tp_from_scratch.sharding import shard_range

DDP_BUCKET_BYTES = 25 * 2 ** 20   # DistributedDataParallel's default bucket_cap_mb


def stage_blocks(n_layers, stage, pp):
    """How many blocks pipeline stage ``stage`` of ``pp`` holds (numpy.array_split)."""
    start, stop = shard_range(n_layers, stage, pp)
    return stop - start


def _where(name):
    """"first", "last" or "block": which stage holds parameter ``name`` of gpt.inventory.parameters."""
    if name.startswith(("wte", "wpe")):
        return "first"
    if name.startswith(("ln_f", "lm_head")):
        return "last"
    return "block"


def stage_parameter_count(config, pp=1, stage=0, t=1, tp_rank=0, arch=None):
    """Parameters held by one rank: TP rank ``tp_rank`` of ``t`` in pipeline stage ``stage`` of ``pp``."""
    blocks = stage_blocks(config.n_layers, stage, pp)
    first, last = stage == 0, stage == pp - 1
    n = 0
    for p in parameters(config, arch):
        count, where = p.count(t, tp_rank), _where(p.name)
        if where == "block":
            n += count // p.copies * blocks
        elif where == "first" and first:
            n += count
        elif where == "last" and last:
            n += count
        if p.name == "wte.weight" and last and not first and config.tie_embeddings:
            n += count   # the last stage's copy of the tied embedding, its LM head
    return n


def chunk(numel, dp):
    """Elements of the largest ZeRO chunk: ceil(N / dp)."""
    return -(-numel // dp)


def memory(config, dp=1, pp=1, t=1, zero=0, itemsize=4, stage=0, tp_rank=0, dp_rank=0, arch=None):
    """{"weights", "gradients", "optimizer"} in bytes on one rank after a step (AdamW: m, v).

    weights: the stage's TP shard, plus ZeRO's flat copy of this rank's chunk;
    gradients: every parameter's (ZeRO-1 also its chunk's copy), ZeRO-2 only the chunk's.
    """
    n = stage_parameter_count(config, pp, stage, t, tp_rank, arch)
    if not zero:
        return {"weights": n * itemsize, "gradients": n * itemsize, "optimizer": 2 * n * itemsize}
    size = chunk(n, dp)
    mine = max(0, min(n, (dp_rank + 1) * size) - dp_rank * size)
    grads = (mine if zero == 2 else n + mine) * itemsize
    return {"weights": (n + mine) * itemsize, "gradients": grads, "optimizer": 2 * mine * itemsize}


def tp_calls(config, t, tokens, blocks, first, last):
    """(calls, elements) of the TP all-reduces one micro-batch of ``tokens`` tokens makes on a
    stage of ``blocks`` blocks: gpt.inventory.collective_calls of a model of those blocks, the
    embedding's g on the first stage only, the cross-entropy's and the LM head's on the last."""
    if t == 1:
        return []
    ends = {"embedding": first, "cross-entropy": last, "LM head": last}   # the calls outside the blocks
    stage = replace(config, n_layers=blocks)
    return [(c.calls, c.elements) for c in collective_calls(stage, t, tokens // config.seq_len)
            if c.group == "tp" and all(keep or not c.where.startswith(end) for end, keep in ends.items())]


def step_bytes(config, batch, dp=1, pp=1, t=1, zero=0, ddp=False, micro_batches=1, itemsize=4,
               stage=0, tp_rank=0, arch=None):
    """Per step on one rank: {"collective/group": {"calls", "bytes"}} as the CollectiveCounter
    reports it, and "p2p" the bytes this rank sends point to point (pipeline stages).

    batch: the global batch B; each DP rank takes B/dp sequences, cut into m micro-batches.
    Sequence parallelism is not modelled here (its payloads are Lesson 7's).
    """
    if config.n_kv_heads < t:
        raise ValueError(f"t={t} > nkv={config.n_kv_heads}: the KV replica sums are not modelled here")
    T, H = config.seq_len, config.hidden
    per_rank = batch // dp
    first, last = stage == 0, stage == pp - 1
    blocks = stage_blocks(config.n_layers, stage, pp)
    out = {}

    def add(key, calls, elements):
        row = out.setdefault(key, {"calls": 0, "bytes": 0})
        row["calls"] += calls
        row["bytes"] += calls * elements * itemsize

    m = micro_batches if pp > 1 else 1
    for i in range(m):                            # micro-batches of B_i sequences (tensor_split)
        rows = shard_range(per_rank, i, m)
        for calls, elements in tp_calls(config, t, (rows[1] - rows[0]) * T, blocks, first, last):
            add("all_reduce/tp", calls, elements)
    if dp > 1:
        n = stage_parameter_count(config, pp, stage, t, tp_rank, arch)
        if zero:   # ZeRO-1 and -2 (zero.py): reduce-scatter the padded gradient, all-gather the chunks
            size = chunk(n, dp)
            add("reduce_scatter/dp", 1, size)
            add("all_gather/dp", 1, size)
        elif ddp:   # one all-reduce per bucket of at most 25 MiB (one bucket for a small model)
            buckets = chunk(n * itemsize, DDP_BUCKET_BYTES)
            for b in range(buckets):
                lo, hi = shard_range(n, b, buckets)
                add("all_reduce/dp", 1, hi - lo)
        else:
            add("all_reduce/dp", 1, n)
        add("all_reduce/dp", 1, 1)               # the loss, averaged for the report
    p2p = 0
    if pp > 1:
        activation = per_rank * T * H * itemsize   # all micro-batches together
        p2p += activation * ((not last) + (not first))   # activations forward, gradients backward
        if config.tie_embeddings and (first or last):    # the tied embedding's gradient, both ways
            p2p += stage_parameter_count_of(config, "wte.weight", t, tp_rank, arch) * itemsize
        if last:
            p2p += 8 * (pp - 1)                   # the loss to every other stage (a float64)
    out["p2p"] = {"calls": 0, "bytes": p2p}
    return out


def stage_parameter_count_of(config, name, t=1, tp_rank=0, arch=None):
    """Elements of parameter ``name`` on TP rank ``tp_rank`` of ``t``."""
    return next(p.count(t, tp_rank) for p in parameters(config, arch) if p.name == name)


def normalise(key):
    """A CollectiveCounter key with torch's several names of one collective made one:
    reduce_scatter_single / reduce_scatter_tensor -> reduce_scatter, all_gather_into_tensor -> all_gather."""
    name, _, group = key.partition("/")
    name = {"reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
            "all_gather_into_tensor": "all_gather"}.get(name, name)
    return f"{name}/{group}"


def predicted(record, rank):
    """The cost model's {"memory": ..., "bytes": ...} for one rank of a trainer --measure record
    (parallelisms/train.py); bytes None for sequence parallelism (not modelled here)."""
    from tp_from_scratch.gpt.model import GPTConfig
    config = GPTConfig(**record["config"])
    itemsize = {"float32": 4, "float64": 8}[record["dtype"]]
    kw = dict(dp=record["dp"], pp=record["pp"], t=record["tp"], zero=record["zero"], itemsize=itemsize,
              stage=rank["pp_rank"], tp_rank=rank["tp_rank"])
    mem = memory(config, dp_rank=rank["dp_rank"], **kw)
    if record["sp"]:
        return {"memory": mem, "bytes": None}
    return {"memory": mem, "bytes": step_bytes(config, record["batch_size"], ddp=record["ddp"],
                                              micro_batches=record["micro_batches"], **kw)}


def measured_bytes(rank):
    """A rank's measured bytes per step in step_bytes' form (keys normalised, p2p added)."""
    out = {}
    for key, row in rank["collectives"].items():
        mine = out.setdefault(normalise(key), {"calls": 0, "bytes": 0})
        mine["calls"] += row["calls"]
        mine["bytes"] += row["bytes"]
    out["p2p"] = {"calls": 0, "bytes": rank["p2p_bytes_sent"]}
    return out


def differences(record):
    """Where a --measure record differs from the cost model: a list of sentences (empty: none).

    Compares every rank's weights, gradients and optimizer bytes, and its bytes per step by
    collective and group and point to point, exactly."""
    problems = []
    for rank in record["ranks"]:
        want = predicted(record, rank)
        for k, v in want["memory"].items():
            if rank["memory"][k] != v:
                problems.append(f"rank {rank['rank']}: {k} {rank['memory'][k]:,} bytes measured, {v:,} predicted")
        if want["bytes"] is None:
            continue
        got = measured_bytes(rank)
        for key in sorted(set(got) | set(want["bytes"])):
            g = got.get(key, {"calls": 0, "bytes": 0})
            w = want["bytes"].get(key, {"calls": 0, "bytes": 0})
            if abs(g["bytes"] - w["bytes"]) > 1e-9 or (key != "p2p" and abs(g["calls"] - w["calls"]) > 1e-9):
                problems.append(f"rank {rank['rank']}: {key} {g['calls']:g} calls {g['bytes']:,.0f} bytes per "
                                f"step measured, {w['calls']:g} calls {w['bytes']:,.0f} bytes predicted")
    return problems


def zero_shards_add_up(record):
    """Sentences where a ZeRO record's optimizer bytes over a DP group differ from unsharded AdamW's."""
    if not record["zero"]:
        return []
    from tp_from_scratch.gpt.model import GPTConfig
    config, problems = GPTConfig(**record["config"]), []
    itemsize = {"float32": 4, "float64": 8}[record["dtype"]]
    for rank in record["ranks"]:
        if rank["dp_rank"] != 0:
            continue
        group = [r for r in record["ranks"] if (r["pp_rank"], r["tp_rank"]) == (rank["pp_rank"], rank["tp_rank"])]
        total = sum(r["memory"]["optimizer"] for r in group)
        whole = memory(config, pp=record["pp"], t=record["tp"], itemsize=itemsize, stage=rank["pp_rank"],
                            tp_rank=rank["tp_rank"])["optimizer"]
        if total != whole:
            problems.append(f"ZeRO optimizer state over the DP group of rank {rank['rank']}: {total:,} bytes, "
                            f"unsharded AdamW holds {whole:,}")
    return problems


def zero_model_state_bytes(n_params, dp, stage, precision="mixed"):
    """Bytes of weights + gradients + optimizer state per rank for ZeRO stage 0 (plain DP) to 3.

    Rajbhandari et al. 2020, section 3 and Figure 1, with Lesson 9's bytes per parameter
    (cost.model.PRECISIONS; "mixed": 2 + 2 + 12, the paper's K = 12): stage 1 shards the
    optimizer state, 2 also the gradients, 3 (FSDP) also the weights, each 1/dp per rank.
    """
    from tp_from_scratch.cost.model import PRECISIONS
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage}")
    w, g, o = PRECISIONS[precision]
    return n_params * (w / (dp if stage >= 3 else 1) + g / (dp if stage >= 2 else 1)
                       + o / (dp if stage >= 1 else 1))
