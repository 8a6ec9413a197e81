"""Grader plumbing: every test in test_exNN_*.py gets the marker exNN and an ``impl`` fixture.

Run one exercise:     pytest exercises -m ex01
Grade the reference:  TP_IMPL=reference pytest exercises
Grade a submission:   TP_IMPL=/path/to/their/exercises pytest exercises
On your own ring:     TP_COLLECTIVES=mine pytest exercises -m "ex03 or ex04 or ex05 or ex06"
                      (Exercises 3-6 then run on YOUR Exercise 2 collectives)
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


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(getattr(pytest.mark, exercise_id_of(item.path.name)))


@pytest.fixture(scope="module")
def impl(request):
    """The implementation under test: the learner's, the reference, or a submission's."""
    return load_implementation(exercise_id_of(request.path.name))
