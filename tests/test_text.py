"""Real text offline: the standard-library byte corpus, its split, and TP training on it."""
import pytest
import torch

from single_device import layers_of, single_device_losses
from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.gpt import text, train
from tp_from_scratch.gpt.data import global_batch


def test_text_batches_are_bytes_of_the_right_split_and_a_function_of_seed_and_step():
    x, y = global_batch(5, 4, 24, 256, 0, "text")
    assert x.shape == y.shape == (4, 24) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])                          # targets are the next bytes
    assert torch.equal(global_batch(5, 4, 24, 256, 0, "text")[0], x)  # deterministic
    assert not torch.equal(global_batch(6, 4, 24, 256, 0, "text")[0], x)
    train_bytes, val_bytes = text.split("train"), text.split("val")
    assert len(train_bytes) + len(val_bytes) == len(text.corpus()[0])
    vx, _ = global_batch(0, 2, 24, 256, 0, "text", "val")
    window = bytes(vx[0].tolist())
    assert window in val_bytes.tobytes() and text.decode(text.encode("def x")) == "def x"
    with pytest.raises(ValueError, match="vocab size must be 256"):
        global_batch(0, 2, 8, 67, 0, "text")


def test_tp_training_on_text_follows_one_device():
    argv = ["--data", "text", "--arch", "llama", "--dtype", "float64", "--steps", "4", "--hidden", "16",
            "--heads", "4", "--kv-heads", "2", "--seq-len", "16"]
    expected = single_device_losses(argv)
    assert expected[0] > expected[-1]
    for rank, losses in enumerate(run_spmd(lambda comm: train.train_on_comm(comm, argv), 2)):
        for step, (got, want) in enumerate(zip(losses, expected)):
            assert_matches_reference(torch.tensor(got, dtype=torch.float64), want, name=f"loss at step {step}",
                                     rank=rank, tol=tolerance("float64", layers=layers_of(argv), steps=step))


def test_equal_steps_fails_only_a_run_that_parts_too_early():
    # make demo's verdict: float32 losses equal for 3 steps, then apart by 1e-2 (far above the
    # policy's bound at step 3, 1e-5 x layers x 4 x 1.7)
    losses, ref = [2.0, 1.9, 1.8, 1.71, 1.6], [2.0, 1.9, 1.8, 1.7, 1.6]

    def verdict(argv):
        args = train.parse(argv)
        comparison = train.Comparison(((s, torch.tensor(r)) for s, r in enumerate(ref)), args.dtype,
                                      args.model.n_layers, args.steps, args.equal_steps)
        for step, loss in enumerate(losses):
            comparison.check(step, torch.tensor(loss))
        return comparison

    comparison = verdict(["--steps", "5"])
    assert comparison.failed                                      # default: every step must be equal
    assert "steps 0..2 equal to one device; step 3 differs" in comparison.lines()[-1]
    assert not verdict(["--steps", "5", "--equal-steps", "3"]).failed
    assert verdict(["--steps", "5", "--equal-steps", "4"]).failed