"""Grader plumbing: every test in test_exNN_*.py gets the marker exNN and an ``impl`` fixture.

Run one exercise:     pytest exercises -m ex01
Grade the reference:  TP_IMPL=reference pytest exercises
Grade a submission:   TP_IMPL=/path/to/their/exercises pytest exercises
"""
import pytest

from tp_from_scratch.tools.grading import exercise_id_of, load_implementation


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(getattr(pytest.mark, exercise_id_of(item.path.name)))


@pytest.fixture(scope="module")
def impl(request):
    """The implementation under test: the learner's, the reference, or a submission's."""
    return load_implementation(exercise_id_of(request.path.name))
