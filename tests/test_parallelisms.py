"""Lesson 11: ZeRO-1/2 against unsharded AdamW step by step (simulated ranks), the dp x pp x tp
rank layout, the trainer's refusals, the holdings pictures; and under torchrun, in ONE launch of
4 processes: hand-written averaging, DDP, ZeRO-1/2 on dp=2 x tp=2 and GPipe / 1F1B on
dp=1 x pp=2 x tp=2, each equal to one device and to each other, with every rank's memory and
bytes equal to the cost model's (parallelisms/check.py mesh checks everything inside it).
(The pipeline's own tests are the pipeline engineer's: tests/test_pipeline*.py.)
"""
import pytest

from tests.slow import only_in_test_slow
from tp_from_scratch.comm import SPMDError, run_spmd
from tp_from_scratch.comm.launchers import mpiexec_command, run_command, torchrun_command
from tp_from_scratch.gpt.model import GPTConfig
from tp_from_scratch.parallelisms import check, cost
from tp_from_scratch.gpt.mesh import coordinates, groups, rank_of
from tp_from_scratch.parallelisms.zero import ZeroOptimizer, chunk_bounds


@pytest.mark.parametrize("dp", [2, 3, 4])
def test_zero_equals_unsharded_adamw_every_step_with_a_dp_th_of_the_state(dp):
    # parameters after every step, state adding up to AdamW's (at most ceil(58/dp) x 16 bytes
    # per rank), ZeRO-2 keeping only its chunk's gradient: checked by check.zero_report
    assert run_spmd(check.zero_report, dp) == [True] * dp


# in make test-slow: make test holds ZeRO at dp = 2, 3, 4 on the same from-scratch ring collectives
# (simulated ranks, above), ZeRO under torchrun in the mesh launch below, and MPIComm under
# mpiexec at p = 2, 3, 4 (tests/test_collectives_native.py)
@only_in_test_slow("ZeRO under a third launcher")
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_zero_under_mpiexec_on_the_from_scratch_ring_collectives():
    result = run_command(mpiexec_command(3, "tp_from_scratch.parallelisms.check", "zero"), timeout=100)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "dp=3 ZeRO-2: parameters equal to unsharded AdamW" in result.stdout, result.stdout[-3000:]
    assert "MPIComm" in result.stdout


@pytest.mark.parametrize("dp", [2, 4])
def test_zero_sends_dps_bytes_and_the_naive_zero1_one_and_a_half_times_them(dp):
    # the Meter of the from-scratch ring collectives counts the bytes really sent (gloo would
    # emulate the reduce-scatter with an all-reduce). DP: one all-reduce of the N = 58 gradients;
    # ZeRO pads them to dp chunks of S = ceil(N/dp) (58 = 2 x 29: no padding at dp = 2)
    import torch
    from tp_from_scratch.nn.mappings import all_reduce
    n = sum(p.numel() for p in check.small_model().parameters())
    size = -(-n // dp)

    def sent(run):
        def rank(comm):
            run(comm)
            return sum(t.bytes_sent for t in comm.meter.by_collective.values())
        return run_spmd(rank, dp)

    def dp_step(comm, elements):
        for _ in range(check.ZERO_STEPS):
            all_reduce(comm, torch.zeros(elements, dtype=torch.float64))

    dp_bytes = sent(lambda comm: dp_step(comm, n))
    padded_dp_bytes = sent(lambda comm: dp_step(comm, size * dp))
    assert size * dp != n or padded_dp_bytes == dp_bytes
    for stage in (1, 2):
        zero = sent(lambda comm: check.zero_run(comm, stage))
        assert zero == padded_dp_bytes, f"ZeRO-{stage} at dp={dp} sent {zero}, DP (padded) {padded_dp_bytes}"
    naive = sent(lambda comm: check.zero_run(comm, 1, gradient_reduce="all_reduce"))
    assert [2 * b for b in naive] == [3 * b for b in padded_dp_bytes], (naive, padded_dp_bytes)


def test_the_lessons_comparison_shows_zero_sending_dps_bytes():
    # Lesson 11's committed table (bench parallelisms, 4 torchrun processes): the DP bytes of
    # ZeRO-1 and ZeRO-2 equal DP's to the byte (the meter test above proves it on a Comm)
    import json
    from pathlib import Path
    rows = json.loads((Path(__file__).parents[1] / "lessons/measurements/parallelisms.json").read_text())["rows"]
    dp = {r["strategy"]: r["bytes"]["dp"] for r in rows}
    assert dp["dp4 zero1"] == dp["dp4 zero2"] == dp["dp4"] > 0, dp


def test_zero_rejects_a_stage_it_does_not_have():
    with pytest.raises(SPMDError, match="ZeRO stage must be 1 or 2, got 3"):
        run_spmd(lambda comm: ZeroOptimizer(comm, check.small_model().parameters(), 3), 1)


def test_chunks_cover_every_element_once_even_when_dp_exceeds_n():
    for n, dp in [(58, 3), (58, 4), (3, 5), (0, 2)]:
        bounds = [chunk_bounds(n, dp, r) for r in range(dp)]
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:])), bounds


def test_mesh_layout_puts_tp_innermost_and_pp_outermost():
    dp, pp, tp = 2, 2, 2
    g = groups(dp, pp, tp)
    assert sorted(g["tp"]) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert sorted(g["dp"]) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert sorted(g["pp"]) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    for r in range(8):
        assert rank_of(*coordinates(r, dp, pp, tp), dp, pp, tp) == r
    # pp = 1 is Lesson 6's dp x tp mesh: rank = dp_index * tp + tp_index
    assert [rank_of(d, 0, i, 3, 1, 2) for d in range(3) for i in range(2)] == list(range(6))
    with pytest.raises(ValueError, match="pp_index 2 is outside 0..1"):
        rank_of(0, 2, 0, dp, pp, tp)


def test_cost_model_stage_parameters_add_up_to_the_model():
    config = GPTConfig(n_layers=4)
    from tp_from_scratch.gpt.model import count_parameters, init_gpt
    whole = count_parameters(init_gpt(config, 0))[0]
    tied_copy = config.vocab_size * config.hidden   # the last stage's LM head copy of wte
    assert sum(cost.stage_parameter_count(config, 4, s) for s in range(4)) == whole + tied_copy
    assert sum(cost.stage_parameter_count(config, 1, 0, 2, r) for r in range(2)) > whole / 2


@pytest.mark.parametrize("pp", [1, 2, 3])
def test_the_stages_tp_all_reduces_add_up_to_lesson_6s_inventory(pp):
    # the cost model reads the TP calls from gpt.inventory.collective_calls (not a list of its
    # own): over the stages of a pipeline they are the whole model's, call for call and element
    # for element, the embedding's on the first stage and the loss's and LM head's on the last
    from tp_from_scratch.gpt.inventory import collective_calls
    config = GPTConfig(n_layers=5, hidden=32, n_heads=4, n_kv_heads=2, seq_len=16)
    t, sequences = 2, 3
    stages = [cost.tp_calls(config, t, sequences * config.seq_len, cost.stage_blocks(5, s, pp), s == 0, s == pp - 1)
              for s in range(pp)]
    whole = [(c.calls, c.elements) for c in collective_calls(config, t, sequences) if c.group == "tp"]
    total = lambda calls: (sum(n for n, _ in calls), sum(n * e for n, e in calls))  # noqa: E731
    assert total([c for stage in stages for c in stage]) == total(whole)
    assert cost.tp_calls(config, 1, 48, 5, True, True) == []


VARIANTS = [  # one launch of 4 processes, every mesh and sync in turn, all against one device
    "--variant=",                    # dp=2 x tp=2, Lesson 6's hand-written average
    "--variant=--ddp",               # ... PyTorch's DistributedDataParallel
    "--variant=--zero 1",            # ... ZeRO-1
    "--variant=--zero 2",            # ... ZeRO-2
    "--variant=--dp 1 --pp 2 --schedule gpipe --micro-batches 2",   # dp=1 x pp=2 x tp=2
    "--variant=--dp 1 --pp 2 --schedule 1f1b --micro-batches 3",    # uneven: 8 = 3 + 3 + 2
    "--variant=--pp 2 --tp 1 --zero 2 --micro-batches 2",           # dp=2 x pp=2: ZeRO over stages
]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_mesh_training_equals_one_device_each_other_and_the_cost_model():
    result = run_command(torchrun_command(4, "tp_from_scratch.parallelisms.check", "mesh", "--dp", "2", "--tp", "2",
                                          "--steps", "2", *VARIANTS), timeout=220)
    lines = [l for l in result.stdout.splitlines() if l.startswith("variant ")]
    assert result.returncode == 0 and len(lines) == len(VARIANTS), result.stdout[-3000:]
    assert all(": OK (" in l for l in lines), "\n".join(lines)
    assert [l.split(":")[0] for l in lines] == [
        "variant dp2xtp2 avg", "variant dp2xtp2 ddp", "variant dp2xtp2 zero1", "variant dp2xtp2 zero2",
        "variant pp2xtp2 gpipe m2", "variant pp2xtp2 1f1b m3", "variant dp2xpp2 zero2 1f1b m2"]


@pytest.mark.parametrize("argv, message", [
    (["--dp", "2", "--tp", "1"], "dp=2 x pp=1 x tp=1 = 2 ranks, but 4 processes were launched"),
    (["--dp", "4", "--ddp", "--zero", "1"], "--ddp and --zero are two ways of syncing DP: choose one"),
    (["--pp", "2", "--tp", "2", "--ddp"], "--ddp and --sp run with pp = 1"),
    (["--pp", "4", "--layers", "2"], "pp=4 stages for 2 layers"),
    (["--pp", "4", "--layers", "4", "--micro-batches", "9"], "--micro-batches 9: each DP rank has 8 sequences"),
])
def test_the_trainer_refuses_a_mesh_it_cannot_run_and_says_why(monkeypatch, capsys, argv, message):
    from tp_from_scratch.parallelisms import train
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_holdings_tile_every_part_and_zero_chunks_split_each_slice_over_dp():
    from tp_from_scratch.parallelisms.figures import holdings
    config = GPTConfig(n_layers=4)
    for kw in (dict(dp=4, zero=1), dict(dp=4, zero=2), dict(pp=2, tp=2), dict(dp=2, tp=2, zero=2)):
        dp, pp, tp = kw.get("dp", 1), kw.get("pp", 1), kw.get("tp", 1)
        held = holdings(config, **kw)
        for j in range(config.n_layers + 2):
            weights = sorted({rows[j][1] for rows in held.values() if rows[j][1] is not None})
            assert weights[0][0] == 0 and weights[-1][1] == 1, (kw, j, weights)      # the TP slices tile [0, 1]
            assert all(a[1] == b[0] for a, b in zip(weights, weights[1:])), (kw, j, weights)
            for s in range(pp):
                for i in range(tp):
                    mine = [held[rank_of(d, s, i, dp, pp, tp)][j] for d in range(dp)]
                    if mine[0][1] is None:
                        continue
                    width = mine[0][1][1] - mine[0][1][0]
                    chunks = sum(o[1] - o[0] for *_, o in mine if o is not None)   # O over the DP group
                    assert abs(chunks - width * (dp if not kw.get("zero") else 1)) < 1e-9, (kw, j, s, i)


def test_zero_memory_formula_reproduces_the_papers_figure_1():
    # Rajbhandari et al. 2020, Figure 1: 7.5B parameters, N_d = 64, K = 12
    got = [cost.zero_model_state_bytes(7.5e9, 64, s) / 1e9 for s in range(4)]
    assert [round(g, 1) for g in got] == [120.0, 31.4, 16.6, 1.9], got
