"""Lesson 11's pipeline: schedules as data, and pipelined training equal to one device.

The schedules are checked against their rules (each micro-batch forwarded before its
backward, every send matched by a receive in order, no deadlock, 1F1B's in-flight bound,
the bubble of an ideal clock equal to (p-1)/(m+p-1)). Then the GPT is split over 2 and 3
simulated stages and trained for three AdamW steps with each schedule and m = 1, 2, 4:
every loss, gradient and final parameter must match single-device training. The same check
on real processes (torchrun, mpiexec) is in test_pipeline_launch.py.
"""
import pytest
import torch

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.gpt.model import GPTConfig
from tp_from_scratch.parallelisms import check_pipeline as check
from tp_from_scratch.parallelisms.pipeline import PipelineStage, forward_backward, stage_layers
from tp_from_scratch.parallelisms.schedules import (Action, bubble, bubble_formula, check_schedule,
                                                    format_schedule, gpipe, in_flight, one_f_one_b,
                                                    simulate)

SIZES = [(1, 1), (1, 3), (2, 1), (2, 2), (2, 5), (3, 1), (3, 2), (3, 4), (4, 8), (5, 3)]
SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}


@pytest.mark.parametrize("p, m", SIZES)
@pytest.mark.parametrize("name", SCHEDULES)
def test_schedules_keep_the_rules_and_leave_the_formula_bubble(name, p, m):
    schedule = SCHEDULES[name](p, m)
    check_schedule(schedule, m)  # raises on a broken rule, deadlock included
    # one forward + backward slot per micro-batch and stage; p-1 slots of fill and drain
    assert bubble(simulate(schedule))["fraction"] == pytest.approx(bubble_formula(p, m), abs=1e-12)
    bound = [m] * p if name == "gpipe" else [min(p - s, m) for s in range(p)]
    assert [in_flight(program) for program in schedule] == bound


def test_one_f_one_b_on_three_stages_reads_as_in_the_lesson():
    lines = format_schedule(one_f_one_b(3, 4)).splitlines()
    assert lines[0] == "stage 0: F0 sa0 F1 sa1 F2 sa2 rg0 B0 F3 sa3 rg1 B1 rg2 B2 rg3 B3"
    assert lines[2] == "stage 2: ra0 F0 B0 sg0 ra1 F1 B1 sg1 ra2 F2 B2 sg2 ra3 F3 B3 sg3"


@pytest.mark.parametrize("broken, message", [
    (lambda s: s[0].remove(Action("forward", 1)), "missing [('forward', 1)]"),
    (lambda s: s[1].reverse(), "comes before its"),
    # stage 1 receives mb 1 before mb 0: the channel would hand it mb 0's activations
    (lambda s: s[1].__setitem__(slice(0, 4), s[1][2:4] + s[1][0:2]), "a channel delivers in order"),
    # stage 0 waits for a gradient before sending the activations it depends on
    (lambda s: s[0].__setitem__(slice(0, 2), [s[0][1], s[0][0]]), "comes before its"),
], ids=["missing", "backward first", "out of order", "recv before send"])
def test_check_schedule_names_the_broken_rule(broken, message):
    schedule = gpipe(2, 2)
    broken(schedule)
    with pytest.raises(ValueError) as error:
        check_schedule(schedule, 2)
    assert message in str(error.value)


def test_a_schedule_that_waits_on_itself_is_a_deadlock():
    # both stages want the other's message first: the gradient of mb 0 before sending mb 1
    schedule = one_f_one_b(2, 2)
    schedule[0] = [Action("forward", 0), Action("forward", 1), Action("recv_grad", 0), Action("send_act", 0),
                   Action("backward", 0), Action("send_act", 1), Action("recv_grad", 1), Action("backward", 1)]
    with pytest.raises(ValueError, match="deadlock: stage 0 waits at rg0; stage 1 waits at ra0"):
        simulate(schedule)


@pytest.mark.parametrize("p, m", [(0, 1), (2, 0)])
def test_sizes_below_one_are_refused(p, m):
    for make in SCHEDULES.values():
        with pytest.raises(ValueError, match="n_stages must be at least 1" if p < 1 else "n_micro must be"):
            make(p, m)


def test_blocks_split_as_numpy_array_split():
    assert [list(stage_layers(5, s, 2)) for s in range(2)] == [[0, 1, 2], [3, 4]]
    assert [list(stage_layers(7, s, 3)) for s in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]


@pytest.fixture(scope="module")
def reference():
    config = GPTConfig(**check.CONFIG)
    batches = check.global_batches(3, config)
    return batches, check.single_device_training(config, batches)


@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipelined_training_equals_one_device(reference, schedule, p, m):
    batches, expected = reference
    # every rank asserts its losses, gradients and final parameters inside
    results = run_spmd(check.check_pipeline_training, p, expected, batches, m, schedule)
    # live saved activations, counted as the schedule runs: GPipe holds m, 1F1B min(p - s, m)
    bound = [m] * p if schedule == "gpipe" else [min(p - s, m) for s in range(p)]
    assert [r.peak_in_flight for r in results] == bound
    for r in results:  # equal micro-batches (B = 4): the bytes grow with the count in flight
        if len(set(r.activation_bytes)) == 1:
            assert r.peak_activation_bytes == r.peak_in_flight * r.activation_bytes[0]


def test_a_vit_splits_into_stages_and_trains_as_on_one_device():
    # patch embedding, class token and positions on stage 0, class-token norm and classifier on
    # stage 1; activations (B_i, P+1, H) between them (TP inside the stages: test_pipeline_launch)
    config = check.MODELS["vit"][0]()
    batches = check.global_batches(2, config, kind="vit")
    expected = check.single_device_training(config, batches, kind="vit")
    results = run_spmd(check.check_pipeline_training, 2, expected, batches, 2, "1f1b", kind="vit")
    assert [r.peak_in_flight for r in results] == [2, 1]


def test_untied_head_and_rotary_positions_llama_style():
    # no wpe on the first stage, an lm_head of its own on the last: nothing to sum between them
    config = GPTConfig(**{**check.CONFIG, "arch": "llama"})
    batches = check.global_batches(2, config)
    expected = check.single_device_training(config, batches)
    run_spmd(check.check_pipeline_training, 3, expected, batches, 2, "1f1b", config=config)


def test_a_batch_smaller_than_the_micro_batch_count_is_refused():
    config = GPTConfig(**check.CONFIG)
    idx = torch.zeros(2, config.seq_len, dtype=torch.int64)

    def rank(comm):
        forward_backward(PipelineStage(comm, check.new_model(config)), idx, idx, 3)
    with pytest.raises(Exception, match="a batch of 2 sequences cannot be split into 3 micro-batches"):
        run_spmd(rank, 2)


def test_more_stages_than_blocks_are_refused():
    config = GPTConfig(**{**check.CONFIG, "n_layers": 2})
    with pytest.raises(Exception, match="2 blocks cannot fill 3 pipeline stages"):
        run_spmd(lambda comm: PipelineStage(comm, check.new_model(config)), 3)


def test_only_a_gpt_is_split_into_stages():
    with pytest.raises(Exception, match=r"a pipeline stage splits a GPT \(single-device or TP\) or a ViT, got Linear"):
        run_spmd(lambda comm: PipelineStage(comm, torch.nn.Linear(2, 2)), 2)


def test_the_timeline_picture_draws_one_box_per_forward_and_backward():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from tp_from_scratch.parallelisms.figures_pipeline import draw_schedules, draw_timeline
    fig, ax = plt.subplots()
    draw_timeline(ax, simulate(one_f_one_b(3, 4)), "1F1B")
    assert len(ax.patches) == 2 * 3 * 4 and ax.get_title() == "1F1B: bubble 33%"
    assert len(draw_schedules(2, 3).axes) == 2
    plt.close("all")


def test_a_broken_schedule_is_refused_before_the_pipeline_runs():
    schedule = gpipe(2, 2)
    schedule[1].reverse()
    config = GPTConfig(**check.CONFIG)
    idx = torch.zeros(2, config.seq_len, dtype=torch.int64)
    with pytest.raises(Exception, match="stage 1: .* comes before its"):
        run_spmd(lambda comm: forward_backward(PipelineStage(comm, check.new_model(config)), idx, idx, 2,
                                               schedule), 2)


def test_bfloat16_activations_travel_as_float32_and_arrive_whole():
    # numpy has no bfloat16: the messages cross nn.collectives' bridge as float32 (exact for a
    # bfloat16 value) and turn back on arrival
    config = GPTConfig(**check.CONFIG)
    (idx, targets), = check.global_batches(1, config)
    _, loss = check.new_model(config).to(torch.bfloat16)(idx, targets)

    def rank(comm):
        stage = PipelineStage(comm, check.new_model(config).to(torch.bfloat16))
        result = forward_backward(stage, idx, targets, 2, "1f1b")
        assert all(p.grad.dtype == torch.bfloat16 for p in stage.parameters())
        return result.loss
    for got in run_spmd(rank, 2):  # bf16's tolerance: the micro-batch sum rounds differently
        assert_matches_reference(torch.tensor(got, dtype=torch.bfloat16), loss.detach(), name="bf16 loss",
                                 tol=tolerance(torch.bfloat16, layers=config.n_layers))
