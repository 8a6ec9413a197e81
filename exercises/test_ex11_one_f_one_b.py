"""Graders for Exercise 11: the 1F1B pipeline schedule.

The schedule is data, so most graders read it: the actions of every micro-batch once and in
order, sends matched by receives, no deadlock (``schedules.check_schedule``), the 1F1B order
of computations and its in-flight bound, and the bubble on an ideal clock
(``schedules.simulate``). The last graders hand the schedule to the real pipeline
(``parallelisms.pipeline``, simulated ranks) and train the GPT with it: every loss, gradient
and parameter must equal single-device training.
"""
import copy

import pytest

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.gpt.model import GPTConfig
from tp_from_scratch.parallelisms import check as check_pipeline
from tp_from_scratch.parallelisms.schedules import (OPS, Action, bubble, bubble_formula,
                                                    check_schedule, format_schedule, in_flight, simulate)

SIZES = [(1, 1), (1, 4), (2, 1), (2, 2), (2, 5), (3, 1), (3, 2), (3, 3), (3, 7), (4, 8), (5, 2), (5, 6)]
ids = [f"p{p}-m{m}" for p, m in SIZES]


def compute_order(stage, p, m):
    """What 1F1B computes on ``stage``, in order: ['F0', 'F1', 'B0', ...] (the definition)."""
    warmup = min(p - 1 - stage, m)
    order = [f"F{i}" for i in range(warmup)]
    for k in range(m - warmup):
        order += [f"F{warmup + k}", f"B{k}"]
    return order + [f"B{i}" for i in range(m - warmup, m)]


def shown(schedule):
    return "\n" + format_schedule(schedule)


@pytest.mark.parametrize("p, m", SIZES, ids=ids)
def test_one_program_of_actions_per_stage(impl, p, m):
    schedule = impl.one_f_one_b(p, m)
    assert isinstance(schedule, list) and len(schedule) == p, \
        f"expected a list of {p} programs (one per stage), got {type(schedule).__name__} of {len(schedule)}"
    for s, program in enumerate(schedule):
        for action in program:
            assert isinstance(action, Action) and action.op in OPS and isinstance(action.mb, int), \
                f"stage {s}: {action!r} is not an Action(op, mb) with op in {OPS} and an int mb"


@pytest.mark.parametrize("p, m", SIZES, ids=ids)
def test_every_action_once_in_order_matched_and_without_deadlock(impl, p, m):
    schedule = impl.one_f_one_b(p, m)
    try:
        check_schedule(schedule, m)
    except ValueError as error:
        pytest.fail(f"{error}{shown(schedule)}")


@pytest.mark.parametrize("p, m", SIZES, ids=ids)
def test_each_stage_computes_in_the_1f1b_order(impl, p, m):
    schedule = impl.one_f_one_b(p, m)
    for s, program in enumerate(schedule):
        got = [str(a) for a in program if a.op in ("forward", "backward")]
        assert got == compute_order(s, p, m), (
            f"stage {s} of {p}, m={m}: computes {got}, 1F1B computes {compute_order(s, p, m)} "
            f"(warm-up of min(p-1-s, m) = {min(p - 1 - s, m)} forwards){shown(schedule)}")


@pytest.mark.parametrize("p, m", SIZES, ids=ids)
def test_at_most_p_minus_s_micro_batches_in_flight(impl, p, m):
    schedule = impl.one_f_one_b(p, m)
    got = [in_flight(program) for program in schedule]
    assert got == [min(p - s, m) for s in range(p)], \
        f"micro-batches in flight per stage {got}, 1F1B holds min(p - s, m){shown(schedule)}"


@pytest.mark.parametrize("p, m", SIZES, ids=ids)
def test_the_bubble_on_an_ideal_clock_is_the_formula(impl, p, m):
    schedule = impl.one_f_one_b(p, m)
    try:
        timelines = simulate(schedule)
    except ValueError as error:
        pytest.fail(f"{error}{shown(schedule)}")
    assert bubble(timelines)["fraction"] == pytest.approx(bubble_formula(p, m), abs=1e-12), (
        f"the stages idle {bubble(timelines)['fraction']:.3f} of the time, "
        f"(p-1)/(m+p-1) = {bubble_formula(p, m):.3f}: a send placed too late (or a receive placed too early) keeps the next stage waiting{shown(schedule)}")


def test_every_call_returns_a_new_schedule(impl):
    first = impl.one_f_one_b(3, 4)
    kept = copy.deepcopy(first)
    first[0].clear()
    first[1].append(Action("forward", 99))
    assert impl.one_f_one_b(3, 4) == kept, "changing one returned schedule changed the next one"


@pytest.mark.parametrize("p, m, what", [(0, 2, "n_stages"), (-1, 2, "n_stages"), (3, 0, "n_micro"),
                                        (2, -3, "n_micro")])
def test_sizes_below_one_are_refused(impl, p, m, what):
    with pytest.raises(ValueError, match=f"{what} must be at least 1"):
        impl.one_f_one_b(p, m)


@pytest.fixture(scope="module")
def single_device():
    config = GPTConfig(**check_pipeline.CONFIG)
    batches = check_pipeline.global_batches(2, config)
    return batches, check_pipeline.single_device_training(config, batches)


@pytest.mark.parametrize("p, m", [(3, 2), (2, 4)], ids=["p3-m2", "p2-m4"])
def test_the_schedule_trains_the_pipeline_exactly_as_one_device(impl, request, p, m):
    schedule = impl.one_f_one_b(p, m)
    batches, expected = request.getfixturevalue("single_device")  # trained only once a schedule exists
    # each stage runs its program on simulated ranks and asserts losses, gradients, parameters
    results = run_spmd(check_pipeline.check_pipeline_training, p, expected, batches, m, schedule,
                       timeout=20.0)
    assert [r.peak_in_flight for r in results] == [min(p - s, m) for s in range(p)]
