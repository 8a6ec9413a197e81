"""Grader plumbing: every test in test_exNN_*.py gets the marker exNN and an ``impl`` fixture.

Run one exercise:     .venv/bin/python -m pytest exercises -m ex01
Grade the reference:  TP_IMPL=reference .venv/bin/python -m pytest exercises
Grade a submission:   TP_IMPL=/path/to/their/exercises .venv/bin/python -m pytest exercises
Several in one run:   TP_IMPL=/path/a:/path/b .venv/bin/python -m pytest exercises   (os.pathsep between)
On your own ring:     TP_COLLECTIVES=mine .venv/bin/python -m pytest exercises -m "ex03 or ex04 or ex05a or ex05b"
                      (Exercises 3-5 then run on YOUR Exercise 2 collectives)
"""
import json
import os
import re
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


# TP_IMPL may name several submissions (directories), os.pathsep between them: the ``impl``
# fixture is then parametrized over them, so one pytest process (one start of Python, torch and
# the graders) grades every one, each graded as alone, each line of the log naming its own.
# tools.grade.run_graders_of uses it for many implementations at once (tests/test_graders.py's
# known-wrong ones); TP_GRADE_ONLY (a JSON list of [submission, exercise] pairs) keeps the pairs
# it asks for and deselects the rest.
def submissions():
    value = os.environ.get("TP_IMPL", "")
    return value.split(os.pathsep) if os.pathsep in value else [value]


def pytest_generate_tests(metafunc):
    graded = submissions()
    if len(graded) > 1 and "impl" in metafunc.fixturenames:
        metafunc.parametrize("impl", graded, indirect=True, scope="module",
                             ids=[f"submission{i}" for i in range(len(graded))])


def graded_name(item):
    """The test's name as when its submission is graded alone: the submission's id left out."""
    name = item.nodeid.partition("::")[2]
    return re.sub(r"\[submission\d+\]$|(?<=\[)submission\d+-|-submission\d+(?=[-\]])", "", name)


def graded_pair(item):
    """(the submission, the exercise) a grader item grades."""
    callspec = getattr(item, "callspec", None)
    submission = callspec.params["impl"] if callspec is not None and "impl" in callspec.params else submissions()[0]
    return submission, exercise_id_of(item.path.name)


# TP_GRADE_FIRST_FAILURE=1 (set by tools.grade.run_graders(stop_at_first_failure=True)): each
# exercise's graders stop at that exercise's first failure while the other exercises go on, as
# if each ran alone under -x. One pytest process can then grade a known-wrong implementation of
# every exercise at once (tests/test_graders.py), instead of one process each.
FAILED_PAIRS = pytest.StashKey[set]()


def _stop_each_at_first_failure():
    return os.environ.get("TP_GRADE_FIRST_FAILURE", "") == "1"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    pair = graded_pair(item)
    item.user_properties += [("submission", pair[0]), ("name", graded_name(item))]   # into each report, for the log
    if GRADE_LOG is not None:
        GRADE_LOG.begin(pair)  # before the fixture loads the learner's file
    if _stop_each_at_first_failure() and pair in item.config.stash.get(FAILED_PAIRS, set()):
        pytest.skip("an earlier grader of this exercise failed")  # before any fixture is set up


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if _stop_each_at_first_failure() and outcome.get_result().failed:
        item.config.stash.setdefault(FAILED_PAIRS, set()).add(graded_pair(item))


# TP_GRADE_LOG=<file> (set by tools.grade.run_graders): one JSON line per graded test as it
# finishes (exercise, name, outcome, message), one when an exercise starts and one with the
# tests collected, so that what was graded survives a process that never finishes.
# TP_GRADE_EXERCISE_TIMEOUT=<seconds>: an exercise whose graders run longer than that (a
# function that never returns) is stopped: the log names it and the whole process exits at
# once (a thread stuck in a learner's loop cannot be stopped otherwise); run_graders grades
# the exercises it had not reached in a new process. Every line names the submission it grades
# ("submission"; a grader file that does not import holds none: it fails for every submission).
EXIT_TIMED_OUT = 124


class GradeLog:
    def __init__(self, path, limit):
        self.file = open(path, "a", buffering=1)
        self.lock = threading.Lock()
        self.limit, self.pair, self.started, self.reports = limit, None, 0.0, {}
        if limit:
            threading.Thread(target=self._watch, name="exercise-timeout", daemon=True).start()

    def write(self, **entry):
        with self.lock:
            self.file.write(json.dumps(entry) + "\n")
            self.file.flush()

    def begin(self, pair):
        if pair != self.pair:
            self.started, self.pair = time.monotonic(), pair
            self.write(start=pair[1], submission=pair[0])

    def _watch(self):
        while True:
            time.sleep(0.1)
            pair, started = self.pair, self.started
            if pair is not None and time.monotonic() - started > self.limit:
                self.write(timed_out=pair[1], submission=pair[0], limit=self.limit)
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
            properties = dict(getattr(report, "user_properties", ()))
            self.write(exercise=exercise_id_of(os.path.basename(path)),
                       name=properties.get("name", name) or f"collecting {path}",
                       submission=properties.get("submission"), **self.reports.pop(report.nodeid))


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
            pair = graded_pair(item)
            collected[pair] = collected.get(pair, 0) + 1
        GRADE_LOG.write(collected=[[submission, exercise, n] for (submission, exercise), n in collected.items()])


def pytest_sessionfinish(session):
    if GRADE_LOG is not None:
        GRADE_LOG.pair = None  # every exercise done: nothing left to time


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(getattr(pytest.mark, exercise_id_of(item.path.name)))
    if os.environ.get("TP_GRADE_ONLY"):
        only = {tuple(pair) for pair in json.loads(os.environ["TP_GRADE_ONLY"])}
        deselected = [item for item in items if graded_pair(item) not in only]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if graded_pair(item) in only]


@pytest.fixture(scope="module")
def impl(request):
    """The implementation under test: the learner's, the reference, or a submission's (one of
    several when TP_IMPL names several)."""
    return load_implementation(exercise_id_of(request.path.name), getattr(request, "param", None))
