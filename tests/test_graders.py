"""The graders are proven: they fail on the stubs and on known-wrong code, and pass the reference.

For each exercise this runs its graders in a subprocess (exactly as `make grade` does):
  * with the committed stubs: every test must fail with NotImplementedError;
  * with TP_IMPL=reference: every test must pass;
  * with each known-wrong implementation in tests/known_wrong/<exercise>/: something must fail
    for a reason other than NotImplementedError.
It also pins how many tests each exercise collects, so a grader that silently disappears
(or is skipped) is caught.
"""
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tp_from_scratch.tools.grade import run_graders, run_graders_of
from tp_from_scratch.tools.grading import EXERCISE_DIR, EXERCISES, REPO

KNOWN_WRONG = Path(__file__).parent / "known_wrong"
KNOWN_RIGHT = Path(__file__).parent / "known_right"  # correct, but not the library's way: must pass

# exercise id -> number of graded tests it must collect
EXPECTED_TESTS = {
    "ex01": 42,
    "ex02": 61,
    "ex03": 36,
    "ex04": 38,
    "ex05a": 40,
    "ex05b": 23,
    "ex06": 15,
    "ex07": 49,
    "ex08": 27,
    "ex10": 38,
    "ex11": 67,
    "ex12": 33,
    "ex13": 57,
    "ex14": 58,
}

# known-wrong implementations whose first failure must carry a targeted hint (a substring of it)
EXPECTED_HINTS = {
    ("ex02", "all_reduce_chunks_rows"): "flattened elements",
    ("ex03", "row_bias_on_every_rank"): "(t-1)*b",
    ("ex03", "row_bias_divided_by_t"): "b/t",
    ("ex04", "causal_attention_no_max_subtraction"): "max score",
    ("ex05a", "row_bias_on_every_rank"): "(t-1)*b",
    ("ex05b", "no_max_subtraction"): "exp overflowed",
    ("ex05b", "ignore_index_not_masked"): "ignore_index",
    # a collective skipped at t = 1 must still return a new array / tensor
    ("ex03", "g_forward_returns_the_input_at_t1"): "g forward on rank 0 shares memory",
    ("ex05a", "g_forward_returns_the_input_at_t1"): "g's forward output on rank 0 shares memory",
    ("ex10", "returns_the_input_at_p1"): "at p = 1 too",
    ("ex06", "shares_the_layernorms"): "tp_block's ln1.weight",
    ("ex07", "layernorm_variance_from_mean_of_squares"): "mean of (x - mean)^2",
    ("ex10", "keeps_the_wrong_half_then_indexes_past_the_end"): "the rank whose bit is 0 keeps the LOWER half",
    ("ex11", "sends_activation_after_the_backward"): "a send placed too late",
    ("ex07", "g_forward_no_shard_check"): "the array_split rule gives 2 and 2",
    ("ex07", "layernorm_ignores_eps"): "pass eps on",
    ("ex02", "all_gather_result_in_float64"): "all_gather of float32",
    ("ex05a", "bias_free_layer_gets_a_zero_bias"): "keep bias None",
    # Exercise 12: each wrong step named, not only "MoE output ... largest error"
    ("ex12", "local_expert_not_offset"): "local_expert must be in [0, E/t)",
    ("ex12", "combine_wrong_inverse_permutation"): "combine's inverse permutation",
    ("ex12", "weights_not_normalised"): "weights must sum to one",
    ("ex12", "combine_weights_applied_twice"): "each weight be applied once",
    ("ex12", "float_counts"): "must be integer arrays",
    ("ex12", "ties_to_the_higher_id"): "the lower expert id",
    ("ex12", "combine_weights_the_outputs_in_place_at_t1"): "outputs after combine (must be untouched)",
    ("ex12", "combine_crashes_with_no_tokens"): "test_a_rank_with_no_tokens_still_takes_part",
    ("ex12", "pairing_table_up_to_five_ranks"): "[6-12-4]",
    ("ex12", "float_local_expert"): "local_expert has dtype float64",
    ("ex12", "combine_normalises_the_callers_scores"): "scores after combine (must be untouched)",
    ("ex12", "combine_turns_the_plans_order_into_tokens"): "plan.order after combine (must be untouched)",
    ("ex14", "gathers_the_logits"): "are the logits gathered?",
    ("ex13", "reuses_one_result_buffer"): "return a new array from every call",
    ("ex14", "ids_in_the_logits_dtype"): "V=4099",
}

WRONG_CASES = sorted(
    (exercise, path)
    for exercise, (stem, _) in EXERCISES.items()
    for path in (KNOWN_WRONG / stem).glob("*.py")
)


def test_every_exercise_is_pinned_and_has_known_wrong_implementations():
    assert set(EXPECTED_TESTS) == set(EXERCISES)
    for exercise, (stem, _) in EXERCISES.items():
        wrong = list((KNOWN_WRONG / stem).glob("*.py"))
        assert len(wrong) >= 3, f"{exercise} has only {len(wrong)} known-wrong implementations"


@pytest.fixture(scope="module")
def reference_results():
    return run_graders("reference")


@pytest.mark.slow  # grader subprocesses: not in make test-fast
@pytest.mark.timeout(900)
def test_reference_passes_every_grader(reference_results):
    for exercise, result in reference_results.items():
        assert result.total == EXPECTED_TESTS[exercise], f"{exercise}: collected {result.total} tests"
        assert result.status == "passed", f"{exercise}: {result.failures[:3]}"


def _stubs_are_pristine():
    changed = subprocess.run(["git", "status", "--porcelain", "--", str(EXERCISE_DIR)],
                             cwd=REPO, capture_output=True, text=True)
    return changed.returncode == 0 and not changed.stdout.strip()


@pytest.mark.slow  # grader subprocesses: not in make test-fast
@pytest.mark.timeout(900)
def test_stubs_fail_with_not_implemented(tmp_path):
    # Grade copies of the committed stubs, so a learner's own work in exercises/ does not matter.
    if not _stubs_are_pristine():
        for stem, _ in EXERCISES.values():
            show = subprocess.run(["git", "show", f"HEAD:exercises/{stem}.py"], cwd=REPO,
                                  capture_output=True, text=True, check=True)
            (tmp_path / f"{stem}.py").write_text(show.stdout)
        target = str(tmp_path)
    else:
        target = ""
    for exercise, result in run_graders(target).items():
        assert result.total == EXPECTED_TESTS[exercise], f"{exercise}: collected {result.total} tests"
        assert result.status == "not yet", f"{exercise}: {result.status}, {result.failures[:3]}"


@pytest.fixture(scope="module")
def wrong_results(request, tmp_path_factory):
    """Grade every selected known-wrong implementation, each as a submission of its own.

    Each known-wrong file goes in a directory of its own, graded as that directory's exercise
    with each exercise stopping at its own first failure (as alone under -x). One pytest
    process grades a share of them all (run_graders_of: TP_IMPL names every directory), so
    Python, torch and the graders start once per core instead of once per implementation.
    Only the cases the session runs are graded (`-k ex06` grades ex06's alone).
    """
    selected = [(item.callspec.params["exercise"], item.callspec.params["wrong"])
                for item in request.session.items
                if "wrong" in getattr(getattr(item, "callspec", None), "params", {})]
    root, directory_of = tmp_path_factory.mktemp("known-wrong"), {}
    for exercise, wrong in dict.fromkeys(selected):
        directory = root / f"{exercise}-{wrong.stem}"
        directory.mkdir()
        shutil.copy(wrong, directory / f"{EXERCISES[exercise][0]}.py")
        directory_of[exercise, wrong] = str(directory)
    cases, cores = list(directory_of), os.cpu_count() or 2
    shares = [cases[i::cores] for i in range(cores) if cases[i::cores]]

    def grade(share):
        results = run_graders_of([(directory_of[case], case[0]) for case in share], stop_at_first_failure=True)
        return {case: results[directory_of[case], case[0]] for case in share}

    with ThreadPoolExecutor(max_workers=len(shares) or 1) as pool:
        return {case: result for graded in pool.map(grade, shares) for case, result in graded.items()}


@pytest.mark.slow  # grader subprocesses: not in make test-fast
@pytest.mark.timeout(900)
@pytest.mark.parametrize("exercise,wrong", WRONG_CASES, ids=[f"{e}-{p.stem}" for e, p in WRONG_CASES])
def test_known_wrong_implementation_fails(wrong_results, exercise, wrong):
    result = wrong_results[(exercise, wrong)]
    assert result.status == "failing", f"the graders passed {wrong.name}: {result.status}"
    # a real failure, not only the skips that follow one in a batch (exercises/conftest.py)
    assert result.first_failure and not result.first_failure.endswith(": skipped"), result.failures[:3]
    hint = EXPECTED_HINTS.get((exercise, wrong.stem))
    if hint:
        assert hint in result.first_failure_message, (
            f"{wrong.name}: the first failure lacks the hint {hint!r}: {result.first_failure_message}")


RIGHT_CASES = sorted(
    (exercise, path)
    for exercise, (stem, _) in EXERCISES.items()
    for path in (KNOWN_RIGHT / stem).glob("*.py")
)
# a known-right file that differs from the library in one respect only runs the graders of it
# (pytest -k), not the exercise's whole set
RIGHT_ONLY = {("ex06", "names_the_degree_t"): "raises_the_promised_errors",
              ("ex06", "checks_ffn_first"): "raises_the_promised_errors",
              ("ex13", "written_with_send_and_recv"): "0d_and_empty or integers or extreme"}


@pytest.mark.slow  # grader subprocesses: not in make test-fast
@pytest.mark.timeout(300)
def test_known_right_implementations_pass_their_graders(tmp_path):
    # e.g. ex07 skipping its collectives at t = 1, which the graders promise to accept
    assert RIGHT_CASES and set(RIGHT_ONLY) <= {(e, p.stem) for e, p in RIGHT_CASES}
    for index, (exercise, path) in enumerate(RIGHT_CASES):
        directory = tmp_path / f"{index}"
        directory.mkdir()
        shutil.copy(path, directory / f"{EXERCISES[exercise][0]}.py")
        only = RIGHT_ONLY.get((exercise, path.stem))
        result = run_graders(str(directory), [exercise], keyword=only)[exercise]
        assert only or result.total == EXPECTED_TESTS[exercise], f"{exercise}: collected {result.total} tests"
        assert result.total > 0 and result.status == "passed", f"{path.name}: {result.failures[:3]}"


def test_every_expected_hint_names_a_known_wrong_implementation():
    cases = {(exercise, path.stem) for exercise, path in WRONG_CASES}
    assert set(EXPECTED_HINTS) <= cases, set(EXPECTED_HINTS) - cases


@pytest.mark.slow  # grader subprocesses: not in make test-fast
@pytest.mark.timeout(300)
def test_exercises_3_to_5_can_run_on_the_learners_own_ring(tmp_path):
    # TP_COLLECTIVES=mine: the library's Exercise 3 on a wrong Exercise 2 (every sum doubled)
    # must fail, which proves the graders really ran on the submitted ring
    shutil.copy(KNOWN_WRONG / EXERCISES["ex02"][0] / "sums_twice.py", tmp_path / f"{EXERCISES['ex02'][0]}.py")
    (tmp_path / f"{EXERCISES['ex03'][0]}.py").write_text(
        "from tp_from_scratch.layers.linear import *  # noqa: F401,F403\n"
        "from tp_from_scratch.layers.mappings import *  # noqa: F401,F403\n"
        "from tp_from_scratch.layers.mlp import parallel_mlp_backward, parallel_mlp_forward  # noqa: F401\n")
    result = run_graders(str(tmp_path), ["ex03"], stop_at_first_failure=True, collectives="mine")["ex03"]
    assert result.status == "failing", f"ex03 on a ring that sums twice: {result.status}"
