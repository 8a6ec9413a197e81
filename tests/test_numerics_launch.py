"""Lesson 13 on real processes: one torchrun launch of 4 ranks (and in `make test-slow` one mpiexec
launch beside it).

Each runs tests/spmd_scripts/numerics.py: the fixed tree, the invariant layers and the invariant
GPT bit for bit equal to t = 1 at t = 4 and at t = 2 (MPIComm and its sub-communicators; TorchComm,
the native process group and its sub-groups); under torchrun also clip_grad_norm on a dp x tp
mesh against torch's clip_grad_norm_ on one device, and the doubling backward: torch's
differentiable all-reduces where g belongs give exactly twice the weight gradient at t = 2.
The mpiexec launch (the same checks on MPIComm) runs in `make test-slow`: make test holds them on
the from-scratch collectives on simulated ranks (tests/test_numerics_tree.py, test_numerics_layers.py)
and MPIComm itself under mpiexec at p = 2, 3, 4 (tests/test_collectives_native.py).
t = 8 runs in `make test-slow` (tests/test_slow_tp8.py). Then numerics.train, Lesson 6's trainer
on the invariant GPT, launched at t = 1, 2 and 4 under torchrun and under mpiexec (Lesson 2's
MPIComm): the same losses, bit for bit; and numerics.generate under torchrun: the same greedy ids.
Those three launch series (t = 1, 2, 4 each) run in `make test-slow` (TP_TEST_SLOW=1): make test
holds the same claims on simulated ranks (tests/test_numerics_training.py) within its 15 minutes.
"""
import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.slow import SLOW, only_in_test_slow
from tp_from_scratch.comm.launchers import mpiexec_command, run_command, torchrun_command

SLOW_ONLY = only_in_test_slow("a series of launches at t = 1, 2, 4")

SCRIPT = "tests.spmd_scripts.numerics"
NPROC = 4


def verdicts(stdout):
    """The ranks that printed 'all N numerics checks passed' (ranks print into one pipe at once)."""
    return sorted(int(r) for r in re.findall(r"rank (\d+): all \d+ numerics checks passed", stdout))


@pytest.fixture(scope="module")
def launched():
    commands = {"torchrun": torchrun_command(NPROC, SCRIPT)}
    if SLOW:
        commands["mpiexec"] = mpiexec_command(NPROC, SCRIPT)
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(commands, pool.map(lambda c: run_command(c, timeout=270), commands.values())))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher", [pytest.param("mpiexec", marks=only_in_test_slow("4 processes under mpiexec")),
                                      "torchrun"])
def test_every_numerics_check_passes_on_real_processes(launched, launcher):
    result = launched[launcher]
    errors = [line for line in result.stdout.splitlines() if "Error" in line or " failed" in line]
    assert result.returncode == 0 and verdicts(result.stdout) == list(range(NPROC)), \
        "\n".join(errors[:20]) + "\n" + result.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchs_differentiable_all_reduce_doubles_the_weight_gradient_at_t2(launched):
    out = launched["torchrun"].stdout
    line = re.search(r"rank 0: doubling t=2: ([^\n]*)", out)
    assert line, out[-3000:]
    assert "Megatron g (reduce_from_tp_region) 1.000000 1.000000" in line.group(1)
    assert "torch.distributed.nn.functional.all_reduce 2.000000 2.000000" in line.group(1)
    assert "_functional_collectives.all_reduce 2.000000 2.000000" in line.group(1)
    # at t = 4, four identical losses: four times
    assert "torch.distributed.nn.functional.all_reduce 4.000000 4.000000" in out


@SLOW_ONLY
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_numerics_train_gives_the_same_losses_bit_for_bit_at_t1_t2_and_t4(tmp_path):
    # Lesson 6's trainer on the invariant GPT under torchrun: every step's loss (float32, as the
    # --metrics file records it: Python's repr, exact) the same at t = 1, 2 and 4
    def launch(t):
        metrics = tmp_path / f"t{t}.jsonl"
        result = run_command(torchrun_command(t, "tp_from_scratch.numerics.train", "--tp", str(t), "--vocab-size",
                                              "64", "--steps", "10", "--metrics", str(metrics), "--no-progress"),
                             timeout=550)
        assert result.returncode == 0, result.stdout[-3000:]
        return [json.loads(line)["loss"] for line in metrics.read_text().splitlines()]
    with ThreadPoolExecutor(3) as pool:
        losses = dict(zip((1, 2, 4), pool.map(launch, (1, 2, 4))))
    assert len(losses[1]) == 10 and len(set(losses[1])) > 5, losses[1]
    assert losses[2] == losses[1] and losses[4] == losses[1], losses


@SLOW_ONLY
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_numerics_train_under_mpiexec_gives_the_same_losses_bit_for_bit_at_t1_t2_and_t4():
    # the same trainer on Lesson 2's collectives (MPIComm, through gpt.train.train_on_comm):
    # rank 0 prints every loss with Python's repr, exact
    def launch(t):
        result = run_command(mpiexec_command(t, "tp_from_scratch.numerics.train", "--tp", t, "--vocab-size", 64,
                                             "--steps", 10), timeout=250)
        assert result.returncode == 0 and f"tp={t} on MPIComm" in result.stdout, result.stdout[-3000:]
        return [float(loss) for loss in re.findall(r"step +\d+  loss (\S+)", result.stdout)]
    with ThreadPoolExecutor(3) as pool:
        losses = dict(zip((1, 2, 4), pool.map(launch, (1, 2, 4))))
    assert len(losses[1]) == 10 and len(set(losses[1])) > 5, losses[1]
    assert losses[2] == losses[1] and losses[4] == losses[1], losses


def test_numerics_train_under_mpiexec_refuses_what_needs_torch_distributed_by_name(monkeypatch, capsys):
    from tp_from_scratch.numerics import train
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", "2")
    for argv, message in ((["--tp", "2", "--vocab-size", "64", "--save", "x"], "--save: only under torchrun"),
                          (["--tp", "4", "--vocab-size", "64"], "--tp 4 must equal the 2 processes of mpiexec"),
                          (["--tp", "2"], "vocab size 67 is not divisible by the 8 leaves")):
        with pytest.raises(SystemExit) as exit_info:
            train.main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err, message


@SLOW_ONLY
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_numerics_generate_gives_the_same_greedy_ids_at_t1_t2_and_t4(tmp_path):
    # Lesson 6's gpt.generate (prefill, then decode with the KV cache) on the invariant GPT under
    # torchrun, one launch per t: the same greedy ids. The weights are init_gpt's times 5, so
    # that the greedy ids vary (at 0.02 a tiny random GPT repeats one token)
    import torch

    from tp_from_scratch.gpt.checkpoint import save_single_device
    from tp_from_scratch.gpt.model import GPTConfig, init_gpt
    config = GPTConfig(vocab_size=64, seq_len=32, n_layers=2, hidden=64, n_heads=8, arch="gpt2")
    gpt = init_gpt(config, 0, torch.float32)
    with torch.no_grad():
        for p in gpt.parameters():
            if p.ndim == 2:
                p.mul_(5)
    save_single_device(gpt, tmp_path / "gpt.pt")

    def launch(t):
        result = run_command(torchrun_command(t, "tp_from_scratch.numerics.generate", "--load", tmp_path / "gpt.pt",
                                              "--prompt", "1,2,3", "--new-tokens", "24"), timeout=350)
        line = re.search(rf"tp={t}, float32, greedy: ([\d,]+)", result.stdout)
        assert result.returncode == 0 and line, result.stdout[-3000:]
        return [int(i) for i in line.group(1).split(",")]
    with ThreadPoolExecutor(3) as pool:
        ids = dict(zip((1, 2, 4), pool.map(launch, (1, 2, 4))))
    assert len(ids[1]) == 3 + 24 and len(set(ids[1][3:])) >= 3, ids[1]
    assert ids[2] == ids[1] and ids[4] == ids[1], ids


def test_numerics_train_refuses_what_the_tree_cannot_serve_by_name(monkeypatch, capsys):
    from tp_from_scratch.numerics import train
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--tp", "2"])                       # the default vocabulary of 67
    assert exit_info.value.code == 2
    assert "vocab size 67 is not divisible by the 8 leaves of the fixed reduction tree" in capsys.readouterr().err
