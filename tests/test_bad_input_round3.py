"""Bad input that the commands must refuse in one line: the size flags of every entry point, a
checkpoint of another model, more new tokens than the model has positions, the DeepSeek checks'
flags and world, the planners' absurd and foreign inputs, and a refusal under torchrun.

Each case runs the command's own ``main`` in-process where it can (the parser and its checks
come before any work): it must end with a non-zero status and one line naming the flag, file or
key, no traceback, nothing written. One case needs torchrun: a refusal must reach the user
whichever rank meets it first.
"""
import importlib
import json
import re

import pytest
import torch

from tp_from_scratch.comm.launchers import run_command, torchrun_command
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt.model import GPTConfig, init_gpt


@pytest.fixture(autouse=True)
def not_launched(monkeypatch):
    """A plain ``python -m`` run: no launcher's variables (a refusal is then said at once)."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)


def refusal(main, argv, capsys, status=None):
    """Run a command that must refuse: a non-zero exit status (``status`` if given), no traceback;
    returns the last line of stderr, the refusal."""
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert exit_.value.code not in (0, None), f"exit status {exit_.value.code}; stderr: {err}"
    assert status is None or exit_.value.code == status, f"exit status {exit_.value.code}; stderr: {err}"
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


# ---------------------------------------------------------------------------------------
# Size flags: declared once (gpt.options.add_model_flags), refused while the command line is read
# ---------------------------------------------------------------------------------------

ALL_SIZES = ("--vocab-size", "--seq-len", "--layers", "--hidden", "--heads", "--kv-heads", "--ffn")
# every entry point that declares size flags: (module, leading arguments) -> the flags it has
SIZE_FLAGS = {
    ("tp_from_scratch.deepseek.train", ()): ("--vocab-size", "--seq-len", "--layers", "--hidden", "--heads", "--ffn"),
    ("tp_from_scratch.gpt.train", ()): ALL_SIZES,
    ("tp_from_scratch.sequence_parallel.train", ()): ALL_SIZES,
    ("tp_from_scratch.partial_sync.train", ()): ALL_SIZES,
    ("tp_from_scratch.parallelisms.train", ()): ALL_SIZES,
    ("tp_from_scratch.gpt.generate", ("bench",)): ("--vocab-size", "--layers", "--hidden", "--heads", "--kv-heads"),
    ("tp_from_scratch.cost.planner", ()): ALL_SIZES,
    ("tp_from_scratch.inference.planner", ()): ALL_SIZES,
    ("tp_from_scratch.bench.train", ()): ("--vocab-size", "--seq-len", "--layers", "--hidden", "--heads", "--kv-heads"),
    ("tp_from_scratch.bench.scaling", ()): ("--vocab-size", "--seq-len", "--layers"),
    ("tp_from_scratch.bench.overlap", ()): ("--hidden",),
    ("tp_from_scratch.numerics.bench", ()): ("--hidden", "--ffn"),
    ("tp_from_scratch.demos.transformer_block", ()): ("--hidden", "--heads", "--kv-heads", "--ffn"),
    ("tp_from_scratch.demos.split_matmul", ()): ("--hidden", "--ffn"),
}
# --ffn 0 means "the architecture's width" (4 x hidden; DeepSeek's 2 x hidden), so -4 is its bad value
BAD = {"--ffn": (-4, 0)}


@pytest.mark.parametrize("module, lead, flag", [(m, lead, f) for (m, lead), flags in SIZE_FLAGS.items() for f in flags])
def test_a_size_below_its_least_is_refused_naming_the_flag(module, lead, flag, capsys):
    # before: deepseek.train --heads 0 ZeroDivisionError, --hidden 0 a reshape error, --vocab-size 0
    # "high <= 0", --ffn -4 a negative dimension; --seq-len 0 and --layers 0 exit 0 having done nothing
    value, lowest = BAD.get(flag, (0, 1))
    line = refusal(importlib.import_module(module).main, [*lead, flag, value], capsys, status=2)
    assert line.endswith(f"error: {flag} must be at least {lowest}, got {value}"), line


def test_deepseek_train_refuses_zero_experts_naming_the_flag(capsys):
    # before: "each of the n_group=1 groups needs at least 2 experts (...), got 0", no flag named
    from tp_from_scratch.deepseek import train as ds_train
    assert refusal(ds_train.main, ["--experts", 0], capsys, 2).endswith("error: --experts must be at least 1, got 0")


@pytest.mark.parametrize("module, argv", [
    ("tp_from_scratch.cost.planner", ["--heads", "1", "--hidden", 10 ** 12]),
    ("tp_from_scratch.cost.planner", ["--batch-size", 10 ** 12]),
    ("tp_from_scratch.inference.planner", ["--heads", "1", "--hidden", 10 ** 12]),
    ("tp_from_scratch.inference.planner", ["--batch-size", 10 ** 12]),
    ("tp_from_scratch.inference.planner", ["--context", 10 ** 12]),
    ("tp_from_scratch.deepseek.planner", ["--tokens", 10 ** 15]),
    ("tp_from_scratch.gpt.train", ["--layers", 10 ** 12]),
])
def test_a_size_no_model_has_is_refused_naming_the_flag(module, argv, capsys):
    # before: the planners' numpy ArrayMemoryError, and deepseek.planner's -1,105 bytes after an overflow
    line = refusal(importlib.import_module(module).main, argv, capsys, status=2)
    assert line.endswith(f"error: {argv[-2]} must be at most 2147483647 (2**31 - 1), got {argv[-1]}"), line


# ---------------------------------------------------------------------------------------
# The planners count what they report, in Python integers: no array of the counted size, no wrap
# ---------------------------------------------------------------------------------------

def test_ring_all_reduce_bytes_are_counted_not_allocated():
    from tp_from_scratch.collectives import ring_all_reduce_bytes
    n, p = 10 ** 15 + 3, 8                       # (before: np.empty(n) to cut it into chunks)
    base = n // p                                # the first n % p = 3 chunks hold one more
    chunk = [base + (r < n % p) for r in range(p)]
    for r in range(p):
        assert ring_all_reduce_bytes(n, 2, p, r) == 2 * (2 * n - chunk[r] - chunk[(r + 1) % p])


def test_gpt3_175b_is_planned(capsys):
    # GPT-3 175B at TP = 8 (before: "Unable to allocate 36.0 GiB"); every figure non-negative, and the
    # attention output's 96 all-reduces of B*T*H float32 numbers sent by the ring: 2 (t-1)/t of them each
    from tp_from_scratch.cost import planner
    B, T, H, L, t = 1536, 2048, 12288, 96, 8
    assert planner.main([str(a) for a in ["--hidden", H, "--layers", L, "--heads", 96, "--seq-len", T,
                                          "--batch-size", B, "--tp", t]]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("attention o: g (forward)"))
    assert row.split()[-3:] == [str(L), f"{L * B * T * H * 4:,}", f"{L * 2 * (t - 1) * (B * T * H // t) * 4:,}"], row
    assert not re.search(r"(?<![\w.])-\d", out), out   # no negative figure anywhere


def test_expert_parallel_bytes_stay_exact_past_int64():
    # counts of 10^15 tokens: numpy's int64 products wrapped around to negative bytes before
    from tp_from_scratch.deepseek.expert_parallel import ep_bytes_sent
    from tp_from_scratch.deepseek.planner import balanced_counts
    from tp_from_scratch.sharding import shard_sizes
    ranks, tokens, copies, slots, H = 64, 10 ** 15, 8, 4, 7168
    even = shard_sizes(tokens * copies, ranks * slots)
    own = sum(even[:slots])                                     # what rank 0 keeps, and gets from each rank
    expected = (tokens * copies - own + ranks * own - own) * H * 2 + (ranks - 1) * slots * 8
    assert ep_bytes_sent(balanced_counts(ranks, tokens, copies, slots), 0, H, 2) == expected > 0


def deepseek_config_file(tmp_path, **changes):
    from transformers import DeepseekV3Config
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**DeepseekV3Config().to_dict(), **changes}))
    return path


def test_the_deepseek_planner_refuses_another_models_config_naming_model_type(tmp_path, capsys):
    # before: a GPT-2 config.json exited 0 with DeepSeek-V3's numbers (transformers' defaults)
    from transformers import GPT2Config

    from tp_from_scratch.deepseek import planner
    gpt2 = tmp_path / "gpt2.json"
    gpt2.write_text(json.dumps(GPT2Config().to_dict()))
    line = refusal(planner.main, ["--config", gpt2], capsys, status=2)
    assert f"--config {gpt2}: model_type 'gpt2', not DeepSeek-V3's 'deepseek_v3'" in line, line


@pytest.mark.parametrize("key, value, words", [
    ("n_routed_experts", 0, "n_routed_experts must be at least 1, got 0"),        # before: ZeroDivisionError
    ("num_attention_heads", 0, "num_attention_heads must be at least 1, got 0"),
    ("hidden_size", 2 ** 40, "hidden_size must be at most 2147483647 (2**31 - 1), got 1099511627776"),
    ("num_experts_per_tok", 300, "num_experts_per_tok 300 is more than n_routed_experts 256"),
    ("vocab_size", "many", "not a DeepseekV3 config (Validation error for field 'vocab_size': TypeError: "
                           "Field 'vocab_size' expected int, got str (value: 'many'))"),
])
def test_the_deepseek_planner_refuses_a_size_no_model_has_naming_the_key(key, value, words, tmp_path, capsys):
    from tp_from_scratch.deepseek import planner
    path = deepseek_config_file(tmp_path, **{key: value})
    line = refusal(planner.main, ["--config", path, "--tp", 1, "--ep", 8], capsys, status=2)
    assert line.endswith(f"--config {path}: {words}"), line


# ---------------------------------------------------------------------------------------
# A checkpoint of another model says what it is and which command loads it
# ---------------------------------------------------------------------------------------

TINY = dict(vocab_size=67, seq_len=16, n_layers=2, hidden=32, n_heads=4, n_kv_heads=2)


@pytest.fixture(scope="module")
def llama_file(tmp_path_factory):
    """A single-device file of a small RoPE GPT (16 positions), as gpt.checkpoint export writes."""
    path = tmp_path_factory.mktemp("gpt") / "llama.pt"
    ckpt.save_single_device(init_gpt(GPTConfig(arch="llama", **TINY), 0), path)
    return path


def test_lesson_12_refuses_a_gpt_file_naming_what_it_is_and_its_loader(llama_file, tmp_path, capsys):
    # before: "no checkpoint in llama.pt: neither a 'latest' file nor meta.json"
    from tp_from_scratch.deepseek import convert, generate
    from tp_from_scratch.deepseek import train as ds_train
    gpt_words = f"checkpoint {llama_file} holds an ordinary GPT (--arch llama, "
    loader = f"which {ckpt.GPT_COMMAND} can load, but this run expects a DeepSeek-V3 model"
    for main, argv, status in [(ds_train.main, ["--load", llama_file, "--save", tmp_path / "out"], 2),
                               (generate.main, ["--load", llama_file], 1),
                               (convert.main, ["export", llama_file, "--out", tmp_path / "hf"], 1)]:
        line = refusal(main, argv, capsys, status)
        assert gpt_words in line and loader in line, (argv, line)
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_info_describes_a_single_device_file(llama_file, capsys):
    # read_metadata takes the file now; info has no shards to verify in it
    ckpt.main(["info", str(llama_file)])
    assert "holds an ordinary GPT (--arch llama, every activation synchronized): a single-device file" \
        in capsys.readouterr().out


# ---------------------------------------------------------------------------------------
# Generation: no more new tokens than the model has positions
# ---------------------------------------------------------------------------------------

@pytest.mark.timeout(120)   # before: decoded a billion tokens, until stopped
def test_gpt_generate_refuses_tokens_past_a_rope_models_positions(llama_file, capsys):
    from tp_from_scratch.gpt import generate
    line = refusal(generate.main, ["--load", llama_file, "--prompt", "1,2,3", "--new-tokens", 10 ** 9], capsys, 1)
    assert line == ("rank 0: error: --new-tokens 1000000000: the prompt's 3 tokens and 1000000000 new ones "
                    "need 1000000002 positions, but the model has 16 (seq_len); ask for at most 14"), line
    with pytest.raises(SystemExit) as exit_:     # the most it may ask for is generated
        generate.main(["--load", str(llama_file), "--prompt", "1,2,3", "--new-tokens", "14"])
    assert exit_.value.code == 0 and len(capsys.readouterr().out.split(": ")[-1].split(",")) == 3 + 14


@pytest.mark.timeout(120)   # before: decoded a billion tokens, until stopped
def test_deepseek_generate_refuses_tokens_past_the_models_positions(tmp_path, capsys):
    from tp_from_scratch.deepseek import checkpoint as ds_ckpt
    from tp_from_scratch.deepseek import generate
    from tp_from_scratch.deepseek import train as ds_train
    opts = ds_train.parse(["--seq-len", 12])                 # max_position_embeddings 12
    ds_ckpt.write(tmp_path / "ds", opts.model, ds_ckpt.state_from_model(
        ds_train.init_model(opts.model, 0, torch.float32).model))
    line = refusal(generate.main, ["--load", tmp_path / "ds", "--prompt", "1,2", "--new-tokens", 10 ** 9], capsys, 1)
    assert line == ("rank 0: error: --new-tokens 1000000000: the prompt's 2 tokens and 1000000000 new ones "
                    "need 1000000002 positions, but the model has 12 (max_position_embeddings); ask for at most 10"), line


# ---------------------------------------------------------------------------------------
# deepseek.check: its flags and the number of ranks, before the process group
# ---------------------------------------------------------------------------------------

def test_deepseek_check_refuses_a_zero_timeout(capsys):
    # before: DistNetworkError's traceback
    from tp_from_scratch.deepseek import check
    assert refusal(check.main, ["--timeout", 0], capsys, 2).endswith("error: --timeout must be greater than 0, got 0.0")


def test_deepseek_check_refuses_a_world_its_tiny_model_cannot_be_cut_over(monkeypatch, capsys):
    # before: a ValueError's traceback from every rank, after the process group had started
    from tp_from_scratch.deepseek import check
    monkeypatch.setenv("WORLD_SIZE", "3")
    line = refusal(check.main, [], capsys, 2)
    assert line.endswith("error: 3 ranks: n_routed_experts (for expert parallelism) 8 is not divisible by tp=3: "
                         "the checks' tiny model runs on 1, 2, 4 ranks"), line


# ---------------------------------------------------------------------------------------
# Under torchrun the refusal reaches the user whichever rank meets it first
# ---------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_refusal_under_torchrun_is_printed_even_when_rank_1_refuses_first(tmp_path):
    # rank 0 starts its main only once rank 1 has imported the trainer, and 3 s later
    # (tests/spmd_scripts/rank0_late.py): rank 1 refuses first, every time. Before, rank 1 left at
    # once without a word, torchrun stopped rank 0 before it printed, and only torchrun's summary
    # reached the user; now rank 1 waits to be stopped and rank 0 prints the line.
    result = run_command(torchrun_command(2, "tests.spmd_scripts.rank0_late", tmp_path, 3,
                                          "tp_from_scratch.gpt.train", "--heads", 0), timeout=240)
    assert result.returncode != 0
    lines = [line for line in result.stdout.splitlines() if "--heads must be at least 1, got 0" in line]
    assert lines == ["python -m tp_from_scratch.gpt.train: error: --heads must be at least 1, got 0"], result.stdout
