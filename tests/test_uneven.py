"""Heads, KV heads and FFN widths that t does not divide (Lesson 14, gpt.arch.head_counts).

Ranks hold ⌈n/t⌉ or ⌊n/t⌋ KV heads with the query heads that read them (52 heads at t = 8: 7, 7,
7, 7, 6, 6, 6, 6), FFN columns like numpy.array_split; the TP GPT built by the plan equals one
device at t = 3 and 8 in its forward, every gradient, one optimizer step, training, generation,
checkpoints (both formats, resharded across uneven t's) and Hugging Face's import and export. What
cannot split unevenly is refused naming why: DTensor's styles, the fixed reduction tree, CAAT-Net.
"""
import pytest
import torch

from tests import hf_models
from single_device import layers_of, single_device_losses
from tests.test_convert import check_tp_against_hf, hf_reference, imported
from tests.test_dcp import trained
from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.cost.model import elementwise_elements, forward_flops
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import convert, train
from tp_from_scratch.gpt.arch import head_counts, kv_replicas
from tp_from_scratch.gpt.check import UNEVEN_GPT2, UNEVEN_LLAMA, check_config, check_generation
from tp_from_scratch.gpt.data import global_batch
from tp_from_scratch.gpt.dtensor_plan import check_plannable
from tp_from_scratch.gpt.inventory import parameter_count, parameters
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.parallelize import gpt_to_tp, shard_state_dict, shard_tensor, tp_to_gpt
from tp_from_scratch.numerics import check_invariant
from tp_from_scratch.partial_sync import train as caat_train
from tp_from_scratch.partial_sync.params import check_whole_kv_heads as caat_check
from tp_from_scratch.sequence_parallel.model import gpt_to_sp
from tp_from_scratch.sharding import shard_sizes

UNEVEN = {"gpt2-52-heads": UNEVEN_GPT2, "llama-20-on-4-kv": UNEVEN_LLAMA}


def valid(config, t):
    try:
        config.validate(t)
        return True
    except ValueError:
        return False


def test_52_heads_at_t_8_split_7_and_6():
    q, kv = head_counts(UNEVEN_GPT2, 8)
    assert q == kv == [7, 7, 7, 7, 6, 6, 6, 6]
    assert head_counts(UNEVEN_GPT2, 3) == ([18, 17, 17], [18, 17, 17])
    assert head_counts(UNEVEN_LLAMA, 3) == ([10, 5, 5], [2, 1, 1])              # 5 query heads per KV head
    assert head_counts(UNEVEN_LLAMA, 8) == ([3, 2] * 4, [1, 1, 1, 1])           # each KV head on 2 ranks


@pytest.mark.parametrize("t", [1, 2, 3, 4, 5, 6, 7, 8, 12])
def test_every_query_head_sits_on_a_rank_holding_its_kv_head(t):
    # over every head count up to 24 and every KV count dividing it: the query heads are all there,
    # once; a rank's query heads read only KV heads of that rank; with MHA the split is ⌈nh/t⌉, ⌊nh/t⌋
    for nh in range(1, 25):
        for nkv in (n for n in range(1, nh + 1) if nh % n == 0):
            config = GPTConfig(hidden=2 * nh, n_heads=nh, n_kv_heads=nkv, ffn=t, vocab_size=t)
            if not valid(config, t):
                assert t > nh or (t > nkv and t % nkv), (nh, nkv, t)   # the only refusals left
                continue
            q, kv = head_counts(config, t)
            r, group = kv_replicas(config, t), nh // nkv
            assert len(q) == t and sum(q) == nh and min(q) >= 1 and len(kv) == t // r and sum(kv) == nkv
            if nkv == nh:
                assert q == shard_sizes(nh, t)
            q_start = 0
            for rank in range(t):
                kv_start = sum(kv[:rank // r])
                kv_heads = range(kv_start, kv_start + kv[rank // r])
                assert all(j // group in kv_heads for j in range(q_start, q_start + q[rank])), (nh, nkv, t, rank)
                q_start += q[rank]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("t", [3, 8])
@pytest.mark.parametrize("name", UNEVEN)
def test_uneven_tp_gpt_equals_one_device(name, t):
    # logits, loss, every gradient, one SGD step, the round trip (float64); greedy and sampled ids (float32)
    config = UNEVEN[name]
    run_spmd(lambda comm: check_config(comm, config, torch.float64), t)
    run_spmd(lambda comm: check_generation(comm, config, torch.float32), t)
    # and the split is uneven, as the plan says: the q rows of each rank, whole heads
    q, _ = head_counts(config, t)
    assert len(set(q)) > 1
    rows = run_spmd(lambda comm: gpt_to_tp(comm, init_gpt(config, 0)).blocks[0].attn.q.weight.shape[0], t)
    assert rows == [n * config.head_size for n in q]


@pytest.mark.parametrize("t", [3, 8])
@pytest.mark.parametrize("name", UNEVEN)
def test_the_planners_count_is_what_each_rank_holds(name, t):
    # gpt.inventory counts from the architecture, not a built model: the same numbers per rank
    config = UNEVEN[name]
    held = run_spmd(lambda comm: sum(p.numel() for p in gpt_to_tp(comm, init_gpt(config, 0)).parameters()), t)
    assert held == [parameter_count(config, t=t, rank=r) for r in range(t)]
    assert len(set(held)) > 1


@pytest.mark.parametrize("t", [3, 8])
def test_the_cost_model_prices_the_heads_each_rank_holds(t):
    # Lesson 9's planner, per rank: attention's FLOPs and element-wise work of its own query heads,
    # RoPE on its own KV heads (20 query heads on 4 KV heads: 10, 5, 5 at t = 3)
    config, B = UNEVEN_LLAMA, 2
    q, kv = head_counts(config, t)
    L, T, hs = config.n_layers, config.seq_len, config.head_size
    for rank in range(t):
        work = elementwise_elements(config, None, B, t, rank)
        assert work["softmax"] == L * B * q[rank] * T * T
        assert work["rope"] == L * B * T * (q[rank] + kv[rank // kv_replicas(config, t)]) * hs
        matmuls = 2 * B * T * sum(p.count(t, rank) for p in parameters(config) if p.matmul)   # untied head
        assert forward_flops(config, None, B, t, rank) - matmuls == 4 * B * T ** 2 * hs * q[rank] * L


@pytest.mark.timeout(300)
@pytest.mark.parametrize("t", [3, 8])
def test_uneven_training_follows_one_device(t):
    # five AdamW steps of the trainer's own loop, 52 heads and FFN 100, on simulated ranks, TP and TP + SP
    argv = ["--arch", "gpt2", "--hidden", "104", "--heads", "52", "--kv-heads", "52", "--ffn", "100",
            "--layers", "2", "--seq-len", "12", "--dtype", "float64", "--steps", "5"]
    expected = single_device_losses(argv)
    tp = run_spmd(lambda comm: train.train_on_comm(comm, argv), t)
    # and sequence parallel (Lesson 7), which runs the same TP model on a split sequence
    sp = run_spmd(lambda comm: train.train_on_comm(comm, argv, parallelize=lambda full, group: gpt_to_sp(group, full)), t)
    for rank, losses in enumerate(tp + sp):
        assert len(losses) == len(expected) == 5
        for step, (got, want) in enumerate(zip(losses, expected)):
            assert_matches_reference(torch.tensor(got, dtype=torch.float64), want, name=f"loss at step {step}",
                                     rank=rank, tol=tolerance("float64", layers=layers_of(argv), steps=step))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", ["course", "dcp"])
def test_a_checkpoint_saved_at_t_3_loads_into_the_tp_model_at_t_8_2_and_1(tmp_path, fmt):
    # pieces saved at t = 3 (18, 17, 17 heads) are read at t = 8 (7 or 6 heads), 2 and 1 into the TP
    # model the plan builds there, bit for bit; the optimizer's moments follow the same cut
    config = UNEVEN_GPT2
    full, optimizer = trained(config, seed=4)
    if fmt == "dcp":
        ckpt.write_dcp(tmp_path, full, optimizer, config, tp=3, step=2)
    else:
        name = ckpt.new_checkpoint_name(2)
        records = [ckpt.write_shard(tmp_path, name, r, 3, shard_state_dict(full, 3, r, config),
                                    ckpt.shard_optimizer_state(optimizer, 3, r, config), torch.get_rng_state())
                   for r in range(3)]
        ckpt.commit(tmp_path, name, config, 3, 2, records)
    for t in (8, 2, 1):
        def load(comm):
            local = ckpt.load_shard(tmp_path, config, t, comm.rank)
            tp_model = gpt_to_tp(comm, init_gpt(config, 0, torch.float64))
            tp_model.load_state_dict(local["model"])     # shapes must be the plan's at this t
            for pname, entries in optimizer.items():
                assert_matches_reference(local["optimizer"][pname]["exp_avg"],
                                         shard_tensor(pname, entries["exp_avg"], t, comm.rank, config),
                                         name=f"exp_avg of {pname}", rank=comm.rank, exact=True)
            return tp_to_gpt(tp_model).state_dict()
        for rank, back in enumerate(run_spmd(load, t)):
            for pname, value in full.items():
                assert_matches_reference(back[pname], value, name=f"{pname} at t={t}", rank=rank, exact=True)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_hugging_face_models_import_at_t_3_and_8(name, tmp_path):
    # transformers' own model of 52 heads (GPT-2) or 20 query heads on 4 KV heads (Llama): the TP
    # model of its imported weights gives its logits, loss and every gradient at t = 3 and 8
    hf = (hf_models.gpt2(n_embd=104, n_head=52, n_inner=100, n_positions=12) if name == "gpt2" else
          hf_models.llama(hidden_size=80, num_attention_heads=20, num_key_value_heads=4, intermediate_size=50,
                          max_position_embeddings=12))
    config, full = imported(hf, tmp_path)
    x, y = global_batch(0, 2, 12, 67, seed=5)
    ref = hf_reference(hf, x, y)
    for t in (3, 8):
        run_spmd(lambda comm: check_tp_against_hf(comm, config, full, x, y, ref), t)


@pytest.mark.timeout(300)
def test_a_checkpoint_saved_at_t_3_exports_to_transformers(tmp_path):
    from transformers import AutoModelForCausalLM
    config = UNEVEN_LLAMA
    full, optimizer = trained(config, seed=6)
    model = init_gpt(config, 0, torch.float64)
    model.load_state_dict(full)
    ckpt.write_dcp(tmp_path / "ours", full, optimizer, config, tp=3, step=1)
    assert convert.main(["export", str(tmp_path / "ours"), "--out", str(tmp_path / "hf")]) is None
    hf = hf_models.float64_llama(AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float64,
                                                                      attn_implementation="sdpa"))
    x, _ = global_batch(0, 2, 12, 67, seed=2)
    assert_matches_reference(hf(input_ids=x).logits, model(x)[0], name="logits in transformers")


@pytest.mark.parametrize("check, message", [
    (lambda: check_plannable(UNEVEN_GPT2, 8), "n_heads 52 is not divisible by tp=8: DTensor's ColwiseParallel"),
    (lambda: train.validate(train.parse(["--tp", "3", "--impl", "dtensor"]), 3),
     "n_heads 8 is not divisible by tp=3: DTensor's ColwiseParallel"),
    (lambda: check_invariant(UNEVEN_GPT2, 8, 16), "n_heads 52 is not divisible by tp=8: the fixed reduction tree"),
    (lambda: caat_check(UNEVEN_LLAMA, 3), "number of heads 20 is not divisible by tp=3"),
    (lambda: caat_train.validate(caat_train.parse(["--tp", "3", "--sync-fraction", "0.5"]), 3),
     "n_heads 8 is not divisible by tp=3: CAAT-Net's streams"),
    (lambda: UNEVEN_LLAMA.validate(6), "tp=6 is larger than n_kv_heads 4 but not a multiple of it"),
])
def test_what_cannot_split_unevenly_says_why(check, message):
    problem = None
    try:
        problem = check()
    except ValueError as e:
        problem = str(e)
    assert problem is not None and message in problem, problem
