"""Grade exercises and print a per-exercise summary: passed, not yet, or failing.

    python -m tp_from_scratch.tools.grade                  # your own files in exercises/
    python -m tp_from_scratch.tools.grade --reference      # the library (should all pass)
    python -m tp_from_scratch.tools.grade class/*/         # an instructor: one row per submission
    python -m tp_from_scratch.tools.grade class/*/ --csv grades.csv

A submission is a directory holding files named like the stubs (ex01_split_matmul.py, ...).
"not yet" means every failure is the stub's NotImplementedError; "failing" shows the
first failure so the learner knows where to look. The exit status is 0 only if every
graded exercise passed.
"""
import argparse
import csv
import subprocess
import sys
import tempfile
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
            message = (problem.get("message") or "").strip().splitlines()
            message = message[0] if message else problem.get("type", "error")
            result.failed += 1
            result.not_implemented += "NotImplementedError" in message
            result.failures.append(f"{case.get('name')}: {message}")
            result.first_failure = result.first_failure or result.failures[-1]


def run_graders(impl="", exercises=None, timeout=900, stop_at_first_failure=False):
    """Run the graders in a fresh pytest process; return {exercise id: ExerciseResult}.

    impl: "" (the learner's exercises/), "reference", or a submission directory.
    stop_at_first_failure: pytest -x; enough to prove that a known-wrong implementation fails.
    """
    exercises = list(exercises or EXERCISES)
    results = {e: ExerciseResult(e) for e in exercises}
    files = [str(EXERCISE_DIR / f"test_{EXERCISES[e][0]}.py") for e in exercises]
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider",
               "-o", "junit_family=xunit1", f"--junitxml={junit}", *(["-x"] if stop_at_first_failure else [])]
        proc = run_command(cmd, timeout, env=subprocess_env(TP_IMPL=impl), cwd=REPO)
        if not junit.exists():
            raise RuntimeError(f"pytest wrote no results (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
        _parse_junit(junit, results)
    return results


def print_summary(results, title=None, out=sys.stdout):
    if title:
        print(f"== {title}", file=out)
    for r in results.values():
        detail = f"{r.passed}/{r.total} tests"
        if r.status == "failing":
            detail += f"; first failure: {r.first_failure[:160]}"
        elif r.status == "not yet":
            detail += " (stubs still raise NotImplementedError)"
        print(f"  {r.exercise} {EXERCISES[r.exercise][0]:<34} {r.status:<8} {detail}", file=out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("submissions", nargs="*", help="directories to grade (default: exercises/)")
    parser.add_argument("--reference", action="store_true", help="grade the library's own code")
    parser.add_argument("--exercise", action="append", choices=sorted(EXERCISES), help="only these")
    parser.add_argument("--csv", help="also write one row per submission and exercise to this file")
    args = parser.parse_args(argv)

    targets = ["reference"] if args.reference else (args.submissions or [""])
    rows, all_passed = [], True
    for target in targets:
        if target not in ("", "reference") and not Path(target).is_dir():
            parser.error(f"{target} is not a directory")
        results = run_graders(target, args.exercise)
        print_summary(results, title=target or "exercises/ (your work)")
        for r in results.values():
            all_passed &= r.status == "passed"
            rows.append([target or "exercises", r.exercise, r.status, r.passed, r.total, r.first_failure])
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            csv.writer(f).writerows([["submission", "exercise", "status", "passed", "total", "first failure"], *rows])
    return 0 if all_passed else 1


if __name__ == "__main__":
    sys.exit(main())
