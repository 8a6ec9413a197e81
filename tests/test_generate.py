"""Generation under TP: the KV cache, token ids at t = 2, 4 identical to one device (greedy in
float64 and float32, seeded sampling), and identical to transformers' generate on imported
weights. The torchrun launch of gpt/checks.py generates too (test_model.py)."""
import json

import pytest
import torch

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.gpt.checks import BASE, GPT2, LLAMA
from tp_from_scratch.gpt.generate import generate
from tp_from_scratch.gpt.model import KVCache, init_gpt
from tp_from_scratch.gpt.parallelize import gpt_to_tp


def prompt(config, B=2, T=4, seed=0):
    return torch.randint(config.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("config", [BASE, GPT2, LLAMA], ids=["gpt", "gpt2", "llama"])
def test_prefill_and_decode_with_the_cache_equal_one_full_forward(config):
    model = init_gpt(config, 1, torch.float64)
    x = prompt(config, T=config.seq_len)
    full, _ = model(x)
    cache = KVCache(config.n_layers)
    parts = [model(x[:, :5], cache=cache)[0]] + [model(x[:, i:i + 1], cache=cache)[0]
                                                 for i in range(5, config.seq_len)]
    assert len(cache) == config.seq_len
    assert_matches_reference(torch.cat(parts, dim=1), full, name=f"{config.arch} logits through the KV cache")


def _tp_ids(config, dtype, tp, **kw):
    single = init_gpt(config, 2, dtype).eval()
    x = prompt(config)
    ref = generate(single, x, config.seq_len - 4, **kw)
    full = single.state_dict()
    for rank, ids in enumerate(run_spmd(lambda comm: generate(gpt_to_tp(comm, full, config).eval(), x,
                                                              config.seq_len - 4, **kw), tp)):
        assert torch.equal(ids, ref), f"rank {rank}: {ids.tolist()} != single-device {ref.tolist()}"
    return ref


@pytest.mark.parametrize("config, tp", [(BASE, 2), (LLAMA, 4)], ids=["gpt-t2", "llama-t4"])
def test_tp_generation_gives_the_single_device_token_ids(config, tp):
    # Llama has 2 KV heads: at t = 4 each is cached on 2 ranks
    for dtype in (torch.float64, torch.float32):
        greedy = _tp_ids(config, dtype, tp)
    sampled = _tp_ids(config, torch.float64, tp, sample=True, seed=3, temperature=0.9, top_k=20)
    assert not torch.equal(sampled, greedy)  # sampling did sample


def test_generation_equals_transformers_generate(tmp_path):
    pytest.importorskip("transformers")
    import hf_models
    from tp_from_scratch.gpt.convert import load_hf
    for name, hf in (("gpt2", hf_models.gpt2(seed=4)), ("llama", hf_models.llama(seed=4))):
        hf.save_pretrained(tmp_path / name)
        config, full = load_hf(tmp_path / name, dtype=torch.float64)
        x = prompt(config, T=5, seed=1)
        want = hf.generate(x, max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0,
                           attention_mask=torch.ones_like(x))
        for tp in (1, 2):
            for rank, ids in enumerate(run_spmd(lambda comm: generate(gpt_to_tp(comm, full, config).eval(),
                                                                      x, 10), tp)):
                assert torch.equal(ids, want), f"{name} tp={tp} rank {rank}: {ids.tolist()} != {want.tolist()}"


def test_sampling_draws_like_torch_multinomial():
    # choose() claims to be torch.multinomial(p, 1)'s CPU algorithm on the same generator state
    logits = 3 * torch.randn(4, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    from tp_from_scratch.gpt.generate import choose, sampling_scores
    for seed in range(20):
        probs = sampling_scores(logits, 0.7, 10).softmax(dim=-1)
        want = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed)).squeeze(1)
        got = choose(logits, torch.Generator().manual_seed(seed), 0.7, 10)
        assert torch.equal(got, want), f"seed {seed}: {got.tolist()} != torch.multinomial's {want.tolist()}"


def test_seeded_sampling_equals_transformers_generate_step_by_step(tmp_path):
    # transformers' sampler: logits[:, -1] cast to float32, / temperature, top-k to -inf, softmax,
    # torch.multinomial on the global generator. Ours (TP at t = 2, simulated ranks) with the same
    # seed must give the same ids, and at every step the same processed scores (float32 policy).
    pytest.importorskip("transformers")
    import hf_models
    from tp_from_scratch.gpt.convert import load_hf
    from tp_from_scratch.gpt.generate import last_logits, sampling_scores
    settings = dict(temperature=0.8, top_k=12)
    for name, hf in (("gpt2", hf_models.gpt2(seed=5)), ("llama", hf_models.llama(seed=5))):
        hf.save_pretrained(tmp_path / name)
        config, full = load_hf(tmp_path / name, dtype=torch.float64)
        x = prompt(config, T=4, seed=2)
        torch.manual_seed(7)
        out = hf.generate(x, max_new_tokens=10, do_sample=True, top_p=1.0, eos_token_id=None, pad_token_id=0,
                          attention_mask=torch.ones_like(x), return_dict_in_generate=True, output_scores=True,
                          **settings)
        want, hf_scores = out.sequences, torch.stack(out.scores, dim=1)        # (B, T0+10), (B, 10, V)

        def rank_run(comm):
            model = gpt_to_tp(comm, full, config).eval()
            ids = generate(model, x, 10, sample=True, seed=7, **settings)
            logits, _ = model(want[:, :-1])                                  # every step's logits at once
            scores = torch.stack([sampling_scores(last_logits(model, logits[:, :i]), **settings)
                                  for i in range(x.shape[1], want.shape[1])], dim=1)
            return ids, scores

        for rank, (ids, scores) in enumerate(run_spmd(rank_run, 2)):
            assert torch.equal(scores.isinf(), hf_scores.isinf()), f"{name} rank {rank}: a different top-k"
            kept = ~hf_scores.isinf()
            assert_matches_reference(scores[kept], hf_scores[kept], name=f"{name} sampling scores", rank=rank)
            assert torch.equal(ids, want), f"{name} rank {rank}: {ids.tolist()} != transformers' {want.tolist()}"


def test_text_prompts_from_the_command_line(tmp_path, capsys):
    # make demo's last step: a byte-level checkpoint, several --text prompts, each compared
    from tp_from_scratch.gpt import checkpoint as ckpt
    from tp_from_scratch.gpt.generate import main
    from tp_from_scratch.gpt.model import GPTConfig
    ckpt.save_single_device(init_gpt(GPTConfig(vocab_size=256, seq_len=16, hidden=16, n_heads=4, n_kv_heads=2), 0),
                            tmp_path / "bytes.pt")
    with pytest.raises(SystemExit) as exit_:
        main(["--load", str(tmp_path / "bytes.pt"), "--text", "def ", "--text", "import", "--new-tokens", "5",
              "--sample", "--top-k", "10", "--compare-single"])
    lines = capsys.readouterr().out.splitlines()
    assert exit_.value.code == 0, lines
    assert [line.startswith(want) for line, want in zip(lines[::2], ["tp=1: 'def ", "tp=1: 'import"])] == [True] * 2, lines
    assert lines[1::2] == ["single device: identical token ids"] * 2


def test_generation_stops_at_eos_like_transformers_generate(tmp_path):
    # transformers' greedy generate with an eos id: a sequence that produced it is finished and
    # continues with the pad id (the eos id when none is set); when all are finished it stops.
    # The eos id is row 0's third greedy token, so row 0 alone stops at its first occurrence,
    # and in the batch of 2 it is padded while row 1 goes on.
    pytest.importorskip("transformers")
    import hf_models
    from tp_from_scratch.gpt.convert import gpt_from_weights, load_hf
    for name, hf in (("gpt2", hf_models.gpt2(seed=4)), ("llama", hf_models.llama(seed=4))):
        hf.save_pretrained(tmp_path / name)
        config, full = load_hf(tmp_path / name, dtype=torch.float64)
        x = prompt(config, T=5, seed=1)
        new = generate(gpt_from_weights(config, full, name), x[:1], 3)[0, 5:].tolist()
        eos, stop = new[2], 5 + new.index(new[2]) + 1          # row 0 ends at its first eos
        for batch in (x[:1], x):
            want = hf.generate(batch, max_new_tokens=10, do_sample=False, eos_token_id=eos, pad_token_id=eos,
                               attention_mask=torch.ones_like(batch))
            assert (want[0, stop - 1:] == eos).all() and (want.shape[1] == stop or len(batch) == 2), want.tolist()
            for rank, ids in enumerate(run_spmd(lambda comm: generate(gpt_to_tp(comm, full, config).eval(),
                                                                      batch, 10, eos_ids=(eos,)), 2)):
                assert torch.equal(ids, want), f"{name} tp=2 rank {rank}: {ids.tolist()} != {want.tolist()}"


def test_the_command_says_where_it_stopped_and_ignore_eos_goes_on(tmp_path, capsys):
    # generate --hf reads the eos id of config.json (generation_config.json first, as transformers
    # does); import --out records it, so generate --load of the import stops there too
    from tp_from_scratch.gpt import convert
    from tp_from_scratch.gpt.generate import main
    from tp_from_scratch.gpt.model import GPTConfig
    model = init_gpt(GPTConfig(arch="gpt2", vocab_size=67, seq_len=16, hidden=32, n_heads=4, n_kv_heads=4), 0)
    convert.write_hf(tmp_path / "hf", model.state_dict(), model.config)
    ids = generate(model.eval(), torch.tensor([[1, 2, 3]]), 8)[0].tolist()
    eos = ids[3]                                             # the first new token
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**hf_config, "eos_token_id": eos}))
    assert convert.main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ours")]) is None
    capsys.readouterr()

    def run(*flags):
        with pytest.raises(SystemExit) as exit_:
            main([*flags, "--prompt", "1,2,3", "--new-tokens", "8"])
        assert exit_.value.code == 0
        return capsys.readouterr().out.strip()

    stopped = (f"gpt2, tp=1, float32, greedy: 1,2,3,{eos} (stopped at the end-of-sequence id {eos} after 1 "
               f"new token; --ignore-eos keeps going)")
    assert run("--hf", str(tmp_path / "hf")) == stopped
    assert run("--load", str(tmp_path / "ours")) == stopped
    every = run("--hf", str(tmp_path / "hf"), "--ignore-eos")
    assert every == f"gpt2, tp=1, float32, greedy: {','.join(map(str, ids))}", every
    # generation_config.json, when there is one, names the ids instead (here one never generated)
    unused = min(set(range(67)) - set(ids))
    (tmp_path / "hf" / "generation_config.json").write_text(json.dumps({"eos_token_id": [unused]}))
    assert run("--hf", str(tmp_path / "hf")) == every
