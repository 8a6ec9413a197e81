"""Grade exercises and print a per-exercise summary: passed, not yet, or failing.

    .venv/bin/python -m tp_from_scratch.tools.grade              # your own files in exercises/
    .venv/bin/python -m tp_from_scratch.tools.grade --reference  # the library (should all pass)
    .venv/bin/python -m tp_from_scratch.tools.grade class/*/     # an instructor: one row per submission
    .venv/bin/python -m tp_from_scratch.tools.grade class/*/ --csv grades.csv
    .venv/bin/python -m tp_from_scratch.tools.grade --exercise ex03     # one exercise (make grade EX=ex03)
    .venv/bin/python -m tp_from_scratch.tools.grade --collectives mine  # Exercises 3-6 on YOUR ring (ex02)

A submission is a directory holding files named like the stubs (ex01_split_matmul.py, ...).
"not yet" means every failure is the stub's NotImplementedError; "failing" shows the
first failure (its whole message, wrapped at word boundaries, hints included) and the
command that re-runs that exercise's graders alone. Grading your own exercises/, once
Exercise 2 passes, Exercises 3-6 are graded a second time on your own ring collectives
(TP_COLLECTIVES=mine), so finishing Exercise 2 powers the rest of the course. The exit
status is 0 only if every graded exercise passed.
"""
import argparse
import csv
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from tp_from_scratch.tools.grading import EXERCISES, EXERCISE_DIR, REPO, exercise_id_of
from tp_from_scratch.comm.launchers import run_command, subprocess_env


@dataclass
class ExerciseResult:
    exercise: str
    passed: int = 0
    failed: int = 0
    not_implemented: int = 0
    first_failure: str = ""
    first_failure_message: str = ""  # the whole message of the first failure, hints included
    failures: list = field(default_factory=list)

    @property
    def total(self):
        return self.passed + self.failed

    @property
    def status(self):
        if self.total == 0:
            return "no tests"
        if self.failed == 0:
            return "passed"
        return "not yet" if self.not_implemented == self.failed else "failing"


def _parse_junit(path, results):
    for case in ET.parse(path).getroot().iter("testcase"):
        exercise = exercise_id_of(case.get("classname", "").rsplit(".", 1)[-1])
        if exercise not in results:
            continue
        result = results[exercise]
        problem = case.find("failure")
        problem = problem if problem is not None else case.find("error")
        if case.find("skipped") is not None:
            result.failed += 1  # a grader that skips has not proven anything
            result.failures.append(f"{case.get('name')}: skipped")
        elif problem is None:
            result.passed += 1
        else:
            full = (problem.get("message") or "").strip()
            message = full.splitlines()[0] if full else problem.get("type", "error")
            result.failed += 1
            result.not_implemented += "NotImplementedError" in message
            result.failures.append(f"{case.get('name')}: {message}")
            if not result.first_failure:
                result.first_failure = result.failures[-1]
                result.first_failure_message = f"{case.get('name')}: {full or message}"


def run_graders(impl="", exercises=None, timeout=900, stop_at_first_failure=False, collectives="library"):
    """Run the graders in a fresh pytest process; return {exercise id: ExerciseResult}.

    impl: "" (the learner's exercises/), "reference", or a submission directory.
    stop_at_first_failure: each exercise stops at its own first failure (pytest -x per exercise,
        exercises/conftest.py): enough to prove that a known-wrong implementation fails.
    collectives: "library", or "mine" to run on the ring of impl's Exercise 2 (TP_COLLECTIVES).
    """
    exercises = list(exercises or EXERCISES)
    results = {e: ExerciseResult(e) for e in exercises}
    files = [str(EXERCISE_DIR / f"test_{EXERCISES[e][0]}.py") for e in exercises]
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        # only the one plugin the graders use (their timeouts): auto-loading every installed
        # plugin (jupyter's nbmake, hypothesis, ...) costs ~3 s per run, ~0.4 s without
        cmd = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", "-p", "pytest_timeout",
               "-o", "junit_family=xunit1", f"--junitxml={junit}"]
        env = subprocess_env(TP_IMPL=impl, TP_COLLECTIVES="mine" if collectives == "mine" else "",
                             PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
                             TP_GRADE_FIRST_FAILURE="1" if stop_at_first_failure else "")
        proc = run_command(cmd, timeout, env=env, cwd=REPO)
        if not junit.exists():
            raise RuntimeError(f"pytest wrote no results (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
        _parse_junit(junit, results)
    return results


MAX_MESSAGE_LINES = 14  # of a first failure's message; a rank's full traceback is left to pytest


def rerun_command(exercise, impl="", collectives="library"):
    """The shell command that re-runs one exercise's graders, stopping at the first failure."""
    env = [f"TP_IMPL={impl}"] if impl else []
    env += ["TP_COLLECTIVES=mine"] if collectives == "mine" else []
    return " ".join([*env, ".venv/bin/python -m pytest exercises -m", exercise, "-x"])


def _message_lines(message, width=100):
    """The message's lines up to a rank's traceback, wrapped at word boundaries (never cut mid-word)."""
    lines = []
    for line in message.splitlines():
        if line.startswith("traceback on rank"):
            break
        indent = line[:len(line) - len(line.lstrip())]
        lines += textwrap.wrap(line, width, subsequent_indent=indent + "  ", break_long_words=False,
                               break_on_hyphens=False) or [""]
    while lines and not lines[-1].strip():
        lines.pop()
    if len(lines) > MAX_MESSAGE_LINES:
        lines = lines[:MAX_MESSAGE_LINES] + ["... (the re-run command below shows all of it)"]
    return lines


def print_summary(results, title=None, out=sys.stdout, impl="", collectives="library"):
    if title:
        print(f"== {title}", file=out)
    for r in results.values():
        detail = f"{r.passed}/{r.total} tests"
        if r.status == "not yet":
            detail += " (stubs still raise NotImplementedError)"
        print(f"  {r.exercise} {EXERCISES[r.exercise][0]:<34} {r.status:<8} {detail}", file=out)
        if r.status == "failing":
            print("      first failure:", file=out)
            for line in _message_lines(r.first_failure_message or r.first_failure):
                print(f"        {line}", file=out)
            print(f"      re-run it alone: {rerun_command(r.exercise, impl, collectives)}", file=out)


ON_YOUR_RING = ("ex03", "ex04", "ex05", "ex06")  # the exercises whose graders run on ex02's collectives
_NOT_GRADED = ExerciseResult("none")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("submissions", nargs="*", help="directories to grade (default: exercises/)")
    parser.add_argument("--reference", action="store_true", help="grade the library's own code")
    parser.add_argument("--exercise", action="append", choices=sorted(EXERCISES), help="only these")
    parser.add_argument("--csv", help="also write one row per submission and exercise to this file")
    parser.add_argument("--collectives", choices=["library", "mine", "both"], default=None,
                        help="run Exercises 3-6 on the library's ring, on the ring of the graded "
                             "Exercise 2 (mine), or both (the default for your own exercises/)")
    args = parser.parse_args(argv)

    targets = ["reference"] if args.reference else (args.submissions or [""])
    collectives = args.collectives or ("both" if targets == [""] else "library")
    rows, all_passed = [], True
    for target in targets:
        if target not in ("", "reference") and not Path(target).is_dir():
            parser.error(f"{target} is not a directory")
        title = target or "exercises/ (your work)"
        first = "mine" if collectives == "mine" else "library"
        results = run_graders(target, args.exercise, collectives=first)
        print_summary(results, title=title + (" on your own ring (ex02)" if first == "mine" else ""),
                      impl=target, collectives=first)
        for r in results.values():
            all_passed &= r.status == "passed"
            rows.append([target or "exercises", r.exercise, r.status, r.passed, r.total, r.first_failure])
        built_on = [e for e in ON_YOUR_RING if e in results and results[e].status != "not yet"]
        if collectives == "both" and built_on and results.get("ex02", _NOT_GRADED).status == "passed":
            mine = run_graders(target, built_on, collectives="mine")
            print_summary(mine, title=f"{title}: Exercises 3-6 again, on YOUR ring collectives from ex02",
                          impl=target, collectives="mine")
            all_passed &= all(r.status == "passed" for r in mine.values())
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            csv.writer(f).writerows([["submission", "exercise", "status", "passed", "total", "first failure"], *rows])
    return 0 if all_passed else 1


if __name__ == "__main__":
    sys.exit(main())
