"""Generate tokens with the GPT under tensor parallelism: prefill, then decode with a KV cache.

    # our checkpoint (or an imported Hugging Face one, see convert.py), 2 ranks, greedy,
    # rank 0 also generates on one device and says whether the token ids are identical
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.gpt.generate --load runs/ckpt \\
        --prompt 1,2,3 --new-tokens 20 --compare-single
    # seeded sampling (temperature, top-k): the same ids at every t
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.gpt.generate --load runs/gpt2.pt \\
        --sample --temperature 0.8 --top-k 40 --seed 1
    # latency: prefill time and per-token decode time of a random model at t = world size
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.gpt.generate bench --arch llama

Generation stops at the end-of-sequence id a Hugging Face checkpoint names (--hf, or --load of
a ``convert import --out``), as transformers' generate does, and says so; --ignore-eos keeps
going. The flags follow transformers': --new-tokens (its max_new_tokens) is at least 1;
--temperature is above 0 and --top-k at least 1, both with --sample only (greedy decoding would
ignore them); an empty prompt is refused.

Each rank holds its heads' weights and caches only its heads' keys and values (KVCache in
model.py: Sharded by heads, a replicated KV head when nkv < t). One step of decoding is one
forward of the new token: per block, f (identity), attention on the local heads against the
local cache, g (one all-reduce of (B, 1, H)) after o, and the same for the MLP; at the end the
vocabulary-sharded logits of the last position are all-gathered (B, V), so every rank picks
the same next token (greedy: argmax; sampling: V exponentials from a generator seeded
identically on every rank, so no broadcast is needed; the same draws and the same float32
scores as transformers' generate with torch.manual_seed(seed), see choose).
"""
import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

from tp_from_scratch.comm.launch import torch_main
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import convert, options
from tp_from_scratch.gpt.model import GPT, KVCache, init_gpt
from tp_from_scratch.gpt.parallelize import gpt_to_tp
from tp_from_scratch.nn import VocabParallelEmbedding, gather_from_tp_region


def last_logits(model, logits):
    """The full-vocabulary logits (B, V) of the last position, on every rank.

    TP: the local logits are (B, T, V/t) Sharded(vocab); one all-gather over the TP group.
    """
    last = logits[:, -1]                                       # (B, V/t) or (B, V)
    if isinstance(model.wte, VocabParallelEmbedding):             # the TP GPT: vocabulary Sharded
        return gather_from_tp_region(model.group, last.contiguous(), model.wte.vocab_sizes)
    return last


def sampling_scores(logits, temperature=1.0, top_k=0):
    """The scores sampling draws from, (B, V) float32: logits / temperature, all but the top k
    set to -inf. float32 whatever the model's dtype, as transformers' generate does (it casts the
    last position's logits to float32 before its temperature and top-k processors)."""
    scores = logits.to(torch.float32) / temperature
    if top_k:
        kth = scores.topk(min(top_k, scores.shape[-1]), dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    return scores


def choose(logits, generator=None, temperature=1.0, top_k=0):
    """Next token ids (B,) from full logits (B, V): argmax when ``generator`` is None, else a
    seeded sample from softmax(sampling_scores).

    The sample is the exponential race: token argmax_v p_v / E_v with E_v ~ Exp(1) drawn from
    ``generator``; P(v wins) = p_v. It is the algorithm torch.multinomial(p, 1) runs on the CPU
    (one exponential per entry of p, from the generator it is given or the global one), so a
    generator seeded like transformers' torch.manual_seed(seed) draws the same tokens as its
    generate(do_sample=True) on equal logits (tests/test_generate.py checks both claims). TP:
    every rank holds the full logits and an identically seeded generator, so every rank picks
    the same token without a broadcast.
    """
    if generator is None:
        return logits.argmax(dim=-1)
    probs = sampling_scores(logits, temperature, top_k).softmax(dim=-1)   # (B, V) float32
    race = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / race).argmax(dim=-1)


@torch.no_grad()
def local_last_logits(model, logits):
    """(group or None, this rank's (B, V_r) logits of the last position, its first id): what a
    rank holds before last_logits gathers it; on one device (None, (B, V), 0)."""
    last = logits[:, -1]
    if isinstance(model.wte, VocabParallelEmbedding):
        return model.group, last, model.wte.vocab_start
    return None, last, 0


def generate(model, prompt, new_tokens, *, sample=False, seed=0, temperature=1.0, top_k=0, eos_ids=(),
             pad_id=None, timings=None, pick=None):
    """prompt (B, T0) token ids -> (B, T0 + n), n <= new_tokens, for a GPT, single-device or TP.

    Prefill runs the whole prompt once and fills the KV cache; each decode step runs one token.
    ``eos_ids``: end-of-sequence ids, as transformers' generate treats them: a sequence that has
    produced one is finished and continues with ``pad_id`` (default: the first eos id), and
    generation stops when every sequence is finished (n < new_tokens then). ``timings``: a dict
    that receives "prefill_s" and "decode_s" (a list, one per new token after the first).
    ``pick``: None (gather the logits, then ``choose``: sample, seed, temperature and top_k), or
    pick(group, local_logits, vocab_start, i) -> (B,) ids, called with ``local_last_logits`` and
    the index i of the new token: a way to choose from the vocabulary shards without gathering
    them can be plugged in here, this module knowing nothing of it.
    """
    if new_tokens < 0:
        raise ValueError(f"new_tokens must be at least 0, got {new_tokens}")
    if prompt.shape[1] + max(new_tokens - 1, 0) > model.config.seq_len and model.config.position == "learned":
        raise ValueError(f"prompt {prompt.shape[1]} + {new_tokens} new tokens exceed seq_len "
                         f"{model.config.seq_len}, the last learned position")
    generator = torch.Generator().manual_seed(seed) if sample else None
    eos = torch.tensor(list(eos_ids), dtype=torch.long)
    pad = eos_ids[0] if pad_id is None and len(eos_ids) else pad_id
    finished = torch.zeros(prompt.shape[0], dtype=torch.bool)
    cache = KVCache(model.config.n_layers)
    out, x = [prompt], prompt
    for i in range(new_tokens):
        t0 = time.perf_counter()
        logits, _ = model(x, cache=cache)           # prefill (i = 0): (B, T0, V or V/t); then (B, 1, ...)
        if pick is None:
            token = choose(last_logits(model, logits), generator, temperature, top_k)
        else:
            token = pick(*local_last_logits(model, logits), i)
        if timings is not None and i == 0:
            timings["prefill_s"], timings["decode_s"] = time.perf_counter() - t0, []
        elif timings is not None:
            timings["decode_s"].append(time.perf_counter() - t0)
        if len(eos_ids):
            token = token.masked_fill(finished, pad)
            finished |= torch.isin(token, eos)
        x = token[:, None]
        out.append(x)
        if finished.all():                         # the same on every rank: the same tokens
            break
    return torch.cat(out, dim=1)


def load_model(args):
    """(single-device GPT, end-of-sequence ids) from --load (ours) or --hf (a Hugging Face
    directory); a checkpoint that lacks a tensor, or holds one of another shape, is refused
    naming it. The eos ids are the Hugging Face config's (an import --out records them)."""
    dtype = getattr(torch, args.dtype)
    if args.hf:
        config, full = convert.load_hf(args.hf, dtype=dtype)
        return convert.gpt_from_weights(config, full, args.hf), convert.read_eos_ids(args.hf)
    loaded = ckpt.load_full(args.load)
    full = {k: v.to(dtype) for k, v in loaded["model"].items()}
    eos_ids = tuple(loaded["meta"].get("eos_token_ids", ()))
    return convert.gpt_from_weights(loaded["config"], full, args.load), eos_ids


def single_device(config, full):
    model = GPT(config).to(next(iter(full.values())).dtype)
    model.load_state_dict(full)
    return model.eval()


def token_ids(text):
    """``"1,2,3"`` -> [1, 2, 3]; a ValueError naming --prompt for anything else (or nothing)."""
    try:
        ids = [int(t) for t in text.split(",")]
    except ValueError:
        raise ValueError(f"--prompt must be comma-separated token ids, got {text!r}") from None
    if any(i < 0 for i in ids):
        raise ValueError(f"--prompt token ids must be >= 0, got {text!r}")
    return ids


def parse_prompt(text, config, seed, as_text=None):
    if as_text is not None:  # a byte-level model (--data text): the prompt's UTF-8 bytes
        from tp_from_scratch.gpt.text import encode
        ids = encode(as_text)
    elif text is not None:
        ids = token_ids(text)
    else:
        ids = torch.randint(config.vocab_size, (8,), generator=torch.Generator().manual_seed(seed)).tolist()
    bad = [i for i in ids if not 0 <= i < config.vocab_size]
    if bad:
        raise ValueError(f"prompt token ids {bad} are outside the vocabulary 0..{config.vocab_size - 1}")
    return torch.tensor([ids])


def positions_problem(prompt, new_tokens, positions, what="seq_len", feeds_last=False):
    """The --new-tokens that would run past the model's last position, as one sentence; None if
    they fit. generate never feeds the last new token back, so a prompt of T0 and n new tokens
    read T0 + n - 1 positions (feeds_last: a loop that does, T0 + n). Learned positions end at
    the model's; RoPE would go on turning past them, on positions the model never saw, and a
    large n would run until stopped: refused alike."""
    extra = 0 if feeds_last else 1
    needed = prompt.shape[1] + new_tokens - extra
    if needed <= positions:
        return None
    return (f"--new-tokens {new_tokens}: the prompt's {prompt.shape[1]} tokens and {new_tokens} new ones need "
            f"{needed} positions, but the model has {positions} ({what}); ask for at most "
            f"{max(positions - prompt.shape[1] + extra, 0)}")


def stopped_at_eos(ids, prompt, eos_ids):
    """The note printed after a generation that ended at an end-of-sequence id, else ''."""
    last, n = ids[0, -1].item(), ids.shape[1] - prompt.shape[1]
    if n == 0 or last not in eos_ids:
        return ""
    return (f" (stopped at the end-of-sequence id {last} after {n} new token{'s' * (n > 1)}; "
            f"--ignore-eos keeps going)")


def tp_model(group, single, tp):
    """The model generate runs at t ranks: Lesson 6's TP GPT (gpt_to_tp), the GPT itself at t = 1.
    A later lesson passes its own (run_generate's ``parallelize``) with this signature."""
    return gpt_to_tp(group, single) if tp > 1 else single


def run_generate(args, group, rank, tp, parallelize=tp_model):
    single, eos_ids = load_model(args)
    config = single.config
    config.validate(tp)
    model = parallelize(group, single, tp).eval()
    reference = single if args.compare_single and rank == 0 else None
    eos_ids = () if args.ignore_eos else eos_ids
    status = 0
    for i, text in enumerate(args.text or [None]):     # one generation per --text prompt, seed + i
        kw = dict(sample=args.sample, seed=args.seed + i, top_k=args.top_k,
                  temperature=1.0 if args.temperature is None else args.temperature,
                  eos_ids=eos_ids)
        prompt = parse_prompt(args.prompt, config, args.seed, text)
        problem = positions_problem(prompt, args.new_tokens, config.seq_len)
        if problem:
            raise ValueError(problem)
        ids = generate(model, prompt, args.new_tokens, **kw)
        if rank != 0:
            continue
        if text is None:
            print(f"{config.arch}, tp={tp}, {args.dtype}, {'sampled' if args.sample else 'greedy'}: "
                  f"{','.join(map(str, ids[0].tolist()))}{stopped_at_eos(ids, prompt, eos_ids)}", flush=True)
        else:  # a byte-level model: show the text
            from tp_from_scratch.gpt.text import decode
            print(f"tp={tp}: {decode(ids[0].tolist())!r}{stopped_at_eos(ids, prompt, eos_ids)}", flush=True)
        if reference is not None:
            ref = generate(reference, prompt, args.new_tokens, **kw)
            same = torch.equal(ids, ref)
            print(f"single device: {'identical token ids' if same else 'DIFFERENT token ids: ' + str(ref[0].tolist())}",
                  flush=True)
            status |= not same
    return int(status)


def run_bench(args, group, rank, tp, parallelize=tp_model):
    """Median prefill time and per-token decode time of a random model, at this world's t."""
    config = options.model_config(args, seq_len=args.prompt_len + args.new_tokens)
    full = init_gpt(config, 0, getattr(torch, args.dtype)).state_dict()
    model = parallelize(group, single_device(config, full), tp).eval()
    prompt = torch.randint(config.vocab_size, (args.batch_size, args.prompt_len),
                           generator=torch.Generator().manual_seed(0))
    prefill, decode = [], []
    for rep in range(args.repeats + 1):
        timings = {}
        generate(model, prompt, args.new_tokens, timings=timings)
        if rep:                                              # the first run warms up
            prefill.append(timings["prefill_s"])
            decode.append(statistics.median(timings["decode_s"]))
    result = {"arch": args.arch, "tp": tp, "threads": torch.get_num_threads(), "dtype": args.dtype,
              "batch": args.batch_size, "prompt": args.prompt_len, "new_tokens": args.new_tokens,
              "layers": config.n_layers, "hidden": config.hidden, "heads": config.n_heads,
              "kv_heads": config.n_kv_heads,
              "prefill_ms": 1e3 * statistics.median(prefill), "decode_ms_per_token": 1e3 * statistics.median(decode)}
    if rank == 0:
        print(f"tp={tp} ({torch.get_num_threads()} thread(s) per rank): prefill {result['prefill_ms']:.2f} ms "
              f"({args.prompt_len} tokens), decode {result['decode_ms_per_token']:.3f} ms/token "
              f"({config.arch}, {config.n_layers} layers, H={config.hidden}, B={args.batch_size}, {args.dtype})",
              flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(result) + "\n")
    return 0


def build_parser():
    p = argparse.ArgumentParser(prog="python -m tp_from_scratch.gpt.generate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", choices=["generate", "bench"], default="generate")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--load", help="our checkpoint root or single-device .pt (convert.py import writes both)")
    src.add_argument("--hf", help="a Hugging Face save_pretrained directory (GPT-2 or Llama)")
    p.add_argument("--prompt", help="comma-separated token ids (default: 8 random ids from --seed)")
    p.add_argument("--text", action="append",
                   help="a text prompt, as UTF-8 bytes (a model trained with --data text); repeat for more")
    p.add_argument("--new-tokens", type=int, default=16,
                   help="at most this many (>= 1, as transformers' max_new_tokens); fewer when an "
                        "end-of-sequence id is generated")
    p.add_argument("--ignore-eos", action="store_true",
                   help="generate all --new-tokens past the end-of-sequence id the Hugging Face config names")
    p.add_argument("--sample", action="store_true", help="seeded sampling instead of greedy")
    p.add_argument("--temperature", type=float, help="with --sample: > 0 (default 1)")
    p.add_argument("--top-k", type=int, help="with --sample: draw from the k most likely tokens only (k >= 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--compare-single", action="store_true", help="rank 0 also generates on one device")
    b = options.add_model_flags(p, title="bench (a random model)", only=(
        "arch", "n_layers", "hidden", "n_heads", "n_kv_heads", "vocab_size"), defaults=dict(
        arch="llama", n_layers=4, hidden=512, n_heads=8, n_kv_heads=4, vocab_size=4096))
    b.add_argument("--batch-size", type=int, default=1)
    b.add_argument("--prompt-len", type=int, default=64)
    b.add_argument("--repeats", type=int, default=5)
    b.add_argument("--json", help="append the result as one JSON line")
    return p


def check_arguments(args, world):
    """The first problem with the command line (a sentence), or None: checked on every rank
    before the process group starts or a file is read."""
    if args.mode == "bench":
        sizes = ("n_layers", "hidden", "n_heads", "n_kv_heads", "vocab_size", "batch_size", "prompt_len", "repeats")
        return options.first_problem(
            *(options.positive(options.FLAG_OF.get(name, "--" + name.replace("_", "-")), getattr(args, name))
              for name in sizes),
            # the prefill is one step: the decode time needs a second
            options.at_least("--new-tokens", args.new_tokens, 2))
    if not (args.load or args.hf):
        return "generate needs --load or --hf"
    return options.first_problem(
        options.existing_path("--load", args.load), options.existing_path("--hf", args.hf),
        prompt_problem(args.prompt),
        next(("--text is empty: give at least one character" for t in args.text or [] if t == ""), None),
        options.positive("--new-tokens", args.new_tokens),
        options.greater_than_zero("--temperature", args.temperature),
        options.positive("--top-k", args.top_k),
        None if args.sample or (args.temperature is None and args.top_k is None) else
        "--temperature and --top-k shape sampling: add --sample (without it every token is the most likely one)")


def prompt_problem(text):
    if text is None:
        return None
    if text == "":
        return "--prompt is empty: give at least one token id"
    try:
        token_ids(text)
    except ValueError as e:
        return str(e)
    return None


def main(argv=None, parser=None, parallelize=tp_model):
    """The command line: ``parser`` (default build_parser()'s) and ``parallelize`` (default
    tp_model) are the hooks a later lesson runs this command line with, its own model built by it."""
    args = options.parse_valid_args(parser or build_parser(), check_arguments, argv)

    def generate_or_bench():
        world, rank = dist.get_world_size(), dist.get_rank()
        run = run_bench if args.mode == "bench" else run_generate
        with convert.warnings_as_lines(prefix=f"rank {rank}: "):
            return run(args, dist.group.WORLD if world > 1 else None, rank, world, parallelize)
    torch_main(generate_or_bench, errors=(ValueError, ckpt.CheckpointError))


if __name__ == "__main__":
    main()
