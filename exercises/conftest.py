"""Grader plumbing: every test in test_exNN_*.py gets the marker exNN and an ``impl`` fixture.

Run one exercise:     .venv/bin/python -m pytest exercises -m ex01
Grade the reference:  TP_IMPL=reference .venv/bin/python -m pytest exercises
Grade a submission:   TP_IMPL=/path/to/their/exercises .venv/bin/python -m pytest exercises
On your own ring:     TP_COLLECTIVES=mine .venv/bin/python -m pytest exercises -m "ex03 or ex04 or ex05a or ex05b"
                      (Exercises 3-5 then run on YOUR Exercise 2 collectives)
"""
import os

import pytest

from tp_from_scratch.tools.grading import exercise_id_of, load_implementation


def pytest_configure(config):
    if os.environ.get("TP_COLLECTIVES", "") == "mine":
        from tp_from_scratch.tools.learner_collectives import install
        install()
    # one line per frame: the grader's line and the learner's line, not pages of source
    if getattr(config.option, "tbstyle", "auto") == "auto":
        config.option.tbstyle = "short"


# TP_GRADE_FIRST_FAILURE=1 (set by tools.grade.run_graders(stop_at_first_failure=True)): each
# exercise's graders stop at that exercise's first failure while the other exercises go on, as
# if each ran alone under -x. One pytest process can then grade a known-wrong implementation of
# every exercise at once (tests/test_graders.py), instead of one process each.
FAILED_FILES = pytest.StashKey[set]()


def _stop_each_at_first_failure():
    return os.environ.get("TP_GRADE_FIRST_FAILURE", "") == "1"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _stop_each_at_first_failure() and item.path in item.config.stash.get(FAILED_FILES, set()):
        pytest.skip("an earlier grader of this exercise failed")  # before any fixture is set up


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if _stop_each_at_first_failure() and outcome.get_result().failed:
        item.config.stash.setdefault(FAILED_FILES, set()).add(item.path)


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(getattr(pytest.mark, exercise_id_of(item.path.name)))


@pytest.fixture(scope="module")
def impl(request):
    """The implementation under test: the learner's, the reference, or a submission's."""
    return load_implementation(exercise_id_of(request.path.name))
