"""Grader plumbing: every test in test_exNN_*.py gets the marker exNN and an ``impl`` fixture.

Run one exercise:     .venv/bin/python -m pytest exercises -m ex01
Grade the reference:  TP_IMPL=reference .venv/bin/python -m pytest exercises
Grade a submission:   TP_IMPL=/path/to/their/exercises .venv/bin/python -m pytest exercises
On your own ring:     TP_COLLECTIVES=mine .venv/bin/python -m pytest exercises -m "ex03 or ex04 or ex05a or ex05b"
                      (Exercises 3-5 then run on YOUR Exercise 2 collectives)
"""
import json
import os
import threading
import time

import pytest

from tp_from_scratch.tools.grading import exercise_id_of, load_implementation


def pytest_configure(config):
    global GRADE_LOG
    if os.environ.get("TP_GRADE_LOG"):
        GRADE_LOG = GradeLog(os.environ["TP_GRADE_LOG"], float(os.environ.get("TP_GRADE_EXERCISE_TIMEOUT") or 0))
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
    if GRADE_LOG is not None:
        GRADE_LOG.begin(exercise_id_of(item.path.name))  # before the fixture loads the learner's file
    if _stop_each_at_first_failure() and item.path in item.config.stash.get(FAILED_FILES, set()):
        pytest.skip("an earlier grader of this exercise failed")  # before any fixture is set up


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if _stop_each_at_first_failure() and outcome.get_result().failed:
        item.config.stash.setdefault(FAILED_FILES, set()).add(item.path)


# TP_GRADE_LOG=<file> (set by tools.grade.run_graders): one JSON line per graded test as it
# finishes (exercise, name, outcome, message), one when an exercise starts and one with the
# tests collected, so that what was graded survives a process that never finishes.
# TP_GRADE_EXERCISE_TIMEOUT=<seconds>: an exercise whose graders run longer than that (a
# function that never returns) is stopped: the log names it and the whole process exits at
# once (a thread stuck in a learner's loop cannot be stopped otherwise); run_graders grades
# the exercises it had not reached in a new process.
EXIT_TIMED_OUT = 124


class GradeLog:
    def __init__(self, path, limit):
        self.file = open(path, "a", buffering=1)
        self.lock = threading.Lock()
        self.limit, self.exercise, self.started, self.reports = limit, None, 0.0, {}
        if limit:
            threading.Thread(target=self._watch, name="exercise-timeout", daemon=True).start()

    def write(self, **entry):
        with self.lock:
            self.file.write(json.dumps(entry) + "\n")
            self.file.flush()

    def begin(self, exercise):
        if exercise != self.exercise:
            self.started, self.exercise = time.monotonic(), exercise
            self.write(start=exercise)

    def _watch(self):
        while True:
            time.sleep(0.1)
            exercise, started = self.exercise, self.started
            if exercise is not None and time.monotonic() - started > self.limit:
                self.write(timed_out=exercise, limit=self.limit)
                os._exit(EXIT_TIMED_OUT)

    def report(self, report):
        """Fold setup, call and teardown into one outcome per test; write it after teardown."""
        state = self.reports.setdefault(report.nodeid, {"outcome": "passed", "message": ""})
        if report.failed and state["outcome"] != "failed":
            crash = getattr(report.longrepr, "reprcrash", None)
            state.update(outcome="failed", message=crash.message if crash is not None else str(report.longrepr))
        elif report.skipped and state["outcome"] == "passed":
            state["outcome"] = "skipped"
        if report.when == "teardown" or (report.when == "collect" and report.failed):
            path, _, name = report.nodeid.partition("::")
            self.write(exercise=exercise_id_of(os.path.basename(path)), name=name or f"collecting {path}",
                       **self.reports.pop(report.nodeid))


GRADE_LOG = None


def pytest_runtest_logreport(report):
    if GRADE_LOG is not None:
        GRADE_LOG.report(report)


def pytest_collectreport(report):
    if GRADE_LOG is not None and report.failed and report.nodeid.endswith(".py"):
        GRADE_LOG.report(report)  # a grader file that does not import: its exercise fails


def pytest_collection_finish(session):
    if GRADE_LOG is not None:
        collected = {}
        for item in session.items:
            exercise = exercise_id_of(item.path.name)
            collected[exercise] = collected.get(exercise, 0) + 1
        GRADE_LOG.write(collected=collected)


def pytest_sessionfinish(session):
    if GRADE_LOG is not None:
        GRADE_LOG.exercise = None  # every exercise done: nothing left to time


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(getattr(pytest.mark, exercise_id_of(item.path.name)))


@pytest.fixture(scope="module")
def impl(request):
    """The implementation under test: the learner's, the reference, or a submission's."""
    return load_implementation(exercise_id_of(request.path.name))
