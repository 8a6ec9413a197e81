"""Lesson 8, torch: the CAAT GPT equals its single-device t-stream model, step for step.

  * the t-stream reference at p = 1 IS the ordinary GPT (loss and every gradient);
  * one step of the CAAT GPT on t simulated ranks gives every parameter's gradient of the t-stream
    model (this rank's shard of it), t = 2, 3, 4 and p in {0.5, 0};
  * 50 AdamW steps in float64 at t = 2 and 4 give the reference's loss at every step
    (simulated ranks; the 2-process launch, with every shared option, is
    tests/test_trainer_options.py's; torchrun with 4 processes here in `make test-slow`);
  * the meter: lowering p removes exactly the ring bytes of the unsynced channels;
  * a checkpoint trained with p < 1 refuses to load at another t.
"""
import json

import pytest
import torch

from tests.slow import only_in_test_slow
from tp_from_scratch.collectives import ring_all_reduce_bytes
from tp_from_scratch.comm import run_spmd
from tp_from_scratch.comm.launchers import run_command, torchrun_command
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt.data import global_batch
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.parallelize import shard_state_dict
from tp_from_scratch.partial_sync import train
from tp_from_scratch.partial_sync.autograd import all_reduce_replicated_grads
from tp_from_scratch.partial_sync.mappings import synced_channels
from tp_from_scratch.partial_sync.model import caat_from_gpt, t_stream_forward

SMALL = ["--hidden", "32", "--heads", "4", "--kv-heads", "2", "--layers", "2", "--seq-len", "16",
         "--batch-size", "4", "--vocab-size", "37"]


def small_config(t):
    # t = 3 needs heads, KV heads and hidden divisible by 3
    if t == 3:
        return GPTConfig(vocab_size=37, seq_len=16, n_layers=2, hidden=48, n_heads=6, n_kv_heads=3)
    return GPTConfig(vocab_size=37, seq_len=16, n_layers=2, hidden=32, n_heads=4, n_kv_heads=2)


def test_t_stream_model_at_p_1_is_the_ordinary_gpt():
    config = small_config(4)
    gpt, twin = init_gpt(config, 1, torch.float64), init_gpt(config, 1, torch.float64)
    x, y = global_batch(0, 4, config.seq_len, config.vocab_size, 1)
    _, loss = gpt(x, y)
    loss.backward()
    _, loss_streams = t_stream_forward(twin, x, y, 4, 1.0)
    loss_streams.backward()
    assert_matches_reference(loss_streams, loss, name="loss")
    for (name, p), q in zip(gpt.named_parameters(), twin.parameters()):
        assert_matches_reference(q.grad, p.grad, name=f"grad of {name}")


@pytest.mark.parametrize("t, p", [(2, 0.5), (3, 0.5), (4, 0.5), (4, 0.0)])
def test_one_step_gives_every_gradient_of_the_t_stream_model(t, p):
    config = small_config(t)
    gpt = init_gpt(config, 2, torch.float64)
    x, y = global_batch(0, 4, config.seq_len, config.vocab_size, 2)
    _, loss = t_stream_forward(gpt, x, y, t, p)
    loss.backward()
    full_grads = {n: q.grad for n, q in gpt.named_parameters()}

    def on_rank(comm):
        model = caat_from_gpt(comm, gpt, p)
        _, loss = model(x, y)
        loss.backward()
        all_reduce_replicated_grads(comm, model)
        expected = shard_state_dict(full_grads, t, comm.rank, config)
        for name, q in model.named_parameters():
            assert_matches_reference(q.grad, expected[name], name=f"grad of {name}", rank=comm.rank)
        return loss.item()

    losses = run_spmd(on_rank, t)
    for rank, got in enumerate(losses):
        assert_matches_reference(torch.tensor(got, dtype=torch.float64), loss.detach(), name="loss", rank=rank)


@pytest.mark.parametrize("t", [2, 4])
def test_50_steps_on_simulated_ranks_match_the_t_stream_model(t):
    argv = ["--tp", str(t), "--sync-fraction", "0.5", "--steps", "50", "--dtype", "float64", *SMALL]
    ranks = run_spmd(train.train_on_comm, t, argv, timeout=120)
    reference = train.t_stream_losses(argv)
    for rank, result in enumerate(ranks):
        assert len(result["losses"]) == 50
        for step, (got, want) in enumerate(zip(result["losses"], reference)):
            assert_matches_reference(torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64),
                                     name=f"loss at step {step}", rank=rank,
                                     tol=tolerance("float64", layers=small_config(t).n_layers, steps=step))
    assert reference[-1] < reference[0] - 0.5  # it did learn: the comparison is not of constants


def test_lowering_p_removes_exactly_the_ring_bytes_of_the_private_channels():
    t, config = 2, small_config(2)
    sent = {}
    for p in (1.0, 0.5, 0.0):
        argv = ["--tp", str(t), "--sync-fraction", str(p), "--steps", "1", "--dtype", "float64", *SMALL]
        sent[p] = [r["bytes_sent"][0] for r in run_spmd(train.train_on_comm, t, argv)]
    rows = 4 * config.seq_len  # B * T
    for p in (0.5, 0.0):
        dropped = config.hidden - synced_channels(config.hidden, p)
        for rank in range(t):
            # 2 partial reduces per block forward, 2 backward, each a ring all-reduce of (B, T, k)
            full = ring_all_reduce_bytes(rows * config.hidden, 8, t, rank)
            kept = ring_all_reduce_bytes(rows * (config.hidden - dropped), 8, t, rank)
            assert sent[1.0][rank] - sent[p][rank] == 4 * config.n_layers * (full - kept)


def test_trainer_refuses_a_sync_fraction_outside_0_1_and_dtensor():
    parse = train.parse
    assert "--sync-fraction must be in [0, 1]" in train.validate(parse(["--tp", "2", "--sync-fraction", "1.5"]), 2)
    assert "no partial reduce" in train.validate(parse(["--tp", "2", "--impl", "dtensor"]), 2)
    assert train.validate(parse(["--tp", "2", "--sync-fraction", "0.25"]), 2) is None


def test_checkpoint_trained_below_p_1_refuses_another_t():
    config = small_config(2)

    def fits(saved_meta, tp, p):
        ckpt.check_description(saved_meta, train.description(config, tp, p), "ck")

    fits({"tp": 2, "sync_fraction": 0.5}, 2, 0.5)   # same t and p: fine
    fits({"tp": 2, "sync_fraction": 1.0}, 4, 1.0)   # p = 1 reshards
    fits({"tp": 2}, 4, 1.0)                         # a plain GPT checkpoint
    with pytest.raises(ckpt.CheckpointError, match=r"--sync-fraction 0.5 at --tp 2\).*expects .*--sync-fraction "
                                                   r"0.5 at --tp 4.*partial_sync.train --tp 2 --sync-fraction 0.5"):
        fits({"tp": 2, "sync_fraction": 0.5}, 4, 0.5)
    with pytest.raises(ckpt.CheckpointError, match="expects .*--sync-fraction 0.25 at --tp 2"):
        fits({"tp": 2, "sync_fraction": 0.5}, 2, 0.25)


# make test holds the same claims without this 4-process launch: 50 steps at t = 4 on simulated
# ranks (test_50_steps_on_simulated_ranks_match_the_t_stream_model), 50 steps launched at t = 2
# with the metrics and the checkpoint's p and t (tests/test_trainer_options.py), and the refusal at
# another t (test_checkpoint_trained_below_p_1_refuses_another_t)
@pytest.mark.slow
@pytest.mark.timeout(300)
@only_in_test_slow("4 processes on 2 cores")
@pytest.mark.parametrize("ranks", [4])
def test_torchrun_training_matches_the_t_stream_model(ranks, tmp_path):
    metrics, saved = tmp_path / "metrics.jsonl", tmp_path / "ckpt"
    cmd = torchrun_command(ranks, "tp_from_scratch.partial_sync.train", "--tp", ranks, "--sync-fraction", "0.5",
                           "--steps", 50, "--dtype", "float64", "--compare-single", "--metrics", metrics,
                           "--save", saved, "--no-progress", *SMALL)
    result = run_command(cmd, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "t-stream single-device comparison: 50 of 50 steps equal" in result.stdout, result.stdout[-3000:]
    assert "TP bytes per step on rank 0" in result.stdout
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert len(records) == 50 and all(r["sync_fraction"] == 0.5 and r["tp_bytes"] > 0 for r in records)
    # the checkpoint records p and t: loading it at another t is refused by name
    config = small_config(ranks)
    meta = ckpt.load_full(saved, config, train.description(config, ranks, 0.5))["meta"]
    assert meta["sync_fraction"] == 0.5 and meta["tp"] == ranks
    with pytest.raises(ckpt.CheckpointError, match=f"--sync-fraction 0.5 at --tp {ranks}"):
        ckpt.load_full(saved, config, train.description(config, 6 - ranks, 0.5))


def test_experiment_runs_and_reports_bytes_relative_to_p_1(tmp_path):
    from tp_from_scratch.partial_sync import experiment
    plan = dict(tps=(2,), fractions=(1.0, 0.0), seeds=(0, 1), steps=2,
                config=dict(hidden=16, n_heads=2, n_kv_heads=2, seq_len=8, vocab_size=17),
                batch=2, val_batches=1, timing_steps=2)
    results = experiment.run(plan, log=lambda line: None)
    full, none = results["rows"]
    assert full["bytes_relative"] == 1.0 and 0 < none["bytes_relative"] < 1
    assert none["synced_channels"] == 0 and len(none["val_losses"]) == 2
    json.dumps(results)  # the results file must be plain JSON
    assert experiment.plot(results, tmp_path / "plot.png").exists()
    assert "| 2 | 0 |" in experiment.table(results)
