"""Grade exercises and print a per-exercise summary: passed, not yet, failing or timed out.

    .venv/bin/python -m tp_from_scratch.tools.grade              # your own files in exercises/
    .venv/bin/python -m tp_from_scratch.tools.grade --reference  # the library (should all pass)
    .venv/bin/python -m tp_from_scratch.tools.grade class/*/     # an instructor: one row per submission
    .venv/bin/python -m tp_from_scratch.tools.grade class/*/ --csv grades.csv
    .venv/bin/python -m tp_from_scratch.tools.grade --exercise ex03     # one exercise (make grade EX=ex03)
    .venv/bin/python -m tp_from_scratch.tools.grade --collectives mine  # Exercises 3-5 on YOUR ring (ex02)
    .venv/bin/python -m tp_from_scratch.tools.grade --timeout 300       # seconds per exercise (default 120)

A submission is a directory holding files named like the stubs (ex01_split_matmul.py, ...).
"not yet" means every failure is the stub's NotImplementedError; "failing" shows the
first failure (its whole message, wrapped at word boundaries, hints included) and the
command that re-runs that exercise's graders alone; "timed out" means its graders ran past
--timeout seconds (default 120: a function that never returns) and were stopped, while the
other exercises are graded all the same. Grading your own exercises/, once
Exercise 2 passes, Exercises 3-5 are graded a second time on your own ring collectives
(TP_COLLECTIVES=mine), so finishing Exercise 2 powers the rest of the course. The exit
status is 1 only if an attempted exercise fails or times out: exercises not yet started (their
stubs still raise NotImplementedError) are not failures, so a learner who skipped ahead gets 0.
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from tp_from_scratch.tools.grading import EXERCISES, EXERCISE_DIR, REPO
from tp_from_scratch.comm.launchers import run_command, subprocess_env


EXERCISE_TIMEOUT = 120.0  # seconds one exercise's graders may run (the reference needs a few)
STARTUP_SECONDS = 300.0   # on top of those, for pytest to start and import (a busy machine)


@dataclass
class ExerciseResult:
    exercise: str
    passed: int = 0
    failed: int = 0
    not_implemented: int = 0
    first_failure: str = ""
    first_failure_message: str = ""  # the whole message of the first failure, hints included
    failures: list = field(default_factory=list)
    collected: int = 0       # tests selected for this exercise (0: not known)
    timed_out: float = 0.0   # the limit in seconds it ran past, 0 if it finished

    @property
    def total(self):
        return self.passed + self.failed

    @property
    def status(self):
        if self.timed_out:
            return "timed out"
        if self.total == 0:
            return "no tests"
        if self.failed == 0:
            return "passed"
        return "not yet" if self.not_implemented == self.failed else "failing"


def _add_test(result, name, outcome, message):
    """One graded test's outcome (exercises/conftest.py's log) into ``result``."""
    if outcome == "skipped":
        result.failed += 1  # a grader that skips has not proven anything
        result.failures.append(f"{name}: skipped")
    elif outcome == "passed":
        result.passed += 1
    else:
        full = (message or "").strip()
        first = full.splitlines()[0] if full else "error"
        result.failed += 1
        result.not_implemented += "NotImplementedError" in first
        result.failures.append(f"{name}: {first}")
        if not result.first_failure:
            result.first_failure = result.failures[-1]
            result.first_failure_message = f"{name}: {full or first}"


def _read_log(path, results):
    """Fold a grading log into ``results`` ({(submission, exercise): ExerciseResult}); returns
    (the pairs started, the one timed out or None)."""
    started, timed_out = [], None
    for line in (path.read_text().splitlines() if path.exists() else []):
        try:
            entry = json.loads(line)
        except ValueError:  # the last line of a process killed mid-write
            continue
        if "start" in entry:
            started.append((entry["submission"], entry["start"]))
        elif "timed_out" in entry:
            timed_out = (entry["submission"], entry["timed_out"])
        elif "collected" in entry:
            for submission, exercise, n in entry["collected"]:
                if (submission, exercise) in results:
                    results[submission, exercise].collected = n
        elif "exercise" in entry:
            submission = entry["submission"]   # None: a grader file that failed to import, for every submission
            for pair in [(submission, entry["exercise"])] if submission is not None else list(results):
                if pair in results and pair[1] == entry["exercise"]:
                    _add_test(results[pair], entry["name"], entry["outcome"], entry["message"])
    return started, timed_out


def run_graders(impl="", exercises=None, timeout=EXERCISE_TIMEOUT, stop_at_first_failure=False,
                collectives="library", keyword=None):
    """Run the graders in a fresh pytest process; return {exercise id: ExerciseResult}.

    impl: "" (the learner's exercises/), "reference", or a submission directory.
    timeout: seconds each exercise's graders may run. One that runs longer (a function that
        never returns) is stopped and reads "timed out", with the tests it finished; the
        exercises it had not reached are graded in a new process.
    stop_at_first_failure: each exercise stops at its own first failure (pytest -x per exercise,
        exercises/conftest.py): enough to prove that a known-wrong implementation fails.
    collectives: "library", or "mine" to run on the ring of impl's Exercise 2 (TP_COLLECTIVES).
    keyword: only the graders pytest's -k selects with it (None: all of them).
    """
    pairs = [(impl, e) for e in (exercises or EXERCISES)]
    results = run_graders_of(pairs, timeout, stop_at_first_failure, collectives, keyword)
    return {exercise: results[impl, exercise] for _, exercise in pairs}


def run_graders_of(pairs, timeout=EXERCISE_TIMEOUT, stop_at_first_failure=False, collectives="library",
                   keyword=None):
    """run_graders for several submissions in ONE pytest process (exercises/conftest.py: TP_IMPL
    names them all): one start of Python, torch and the graders instead of one per submission.
    pairs: [(submission directory, exercise id)], each graded as if alone. Returns
    {(submission, exercise): ExerciseResult}. A pair that times out is stopped as in
    run_graders; the pairs not reached are graded in a new process."""
    pairs = list(dict.fromkeys(pairs))
    results = {pair: ExerciseResult(pair[1]) for pair in pairs}
    todo = pairs
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in range(len(pairs)):
            log = Path(tmp) / f"grading-{attempt}.jsonl"
            submissions = list(dict.fromkeys(s for s, _ in todo))
            if len(submissions) > 1 and any(os.pathsep in s or s in ("", "reference") for s in submissions):
                raise ValueError(f"several submissions in one process must be directories without {os.pathsep!r}: "
                                 f"{submissions}")
            files = [str(EXERCISE_DIR / f"test_{EXERCISES[e][0]}.py") for e in dict.fromkeys(e for _, e in todo)]
            # only the one plugin the graders use (their timeouts): auto-loading every installed
            # plugin (jupyter's nbmake, hypothesis, ...) costs ~3 s per run, ~0.4 s without.
            # --tb=no: what is graded comes from the log (each failure's message whole); pytest's
            # tracebacks would go unread, and formatting them took half a run of the stubs
            cmd = [sys.executable, "-m", "pytest", *files, "-q", "--tb=no", "-p", "no:cacheprovider", "-p", "pytest_timeout",
                   *(["-k", keyword] if keyword else [])]
            env = subprocess_env(TP_IMPL=os.pathsep.join(submissions), TP_GRADE_ONLY=json.dumps(todo),
                                 TP_COLLECTIVES="mine" if collectives == "mine" else "",
                                 PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", TP_GRADE_LOG=str(log),
                                 TP_GRADE_EXERCISE_TIMEOUT=str(timeout),
                                 TP_GRADE_FIRST_FAILURE="1" if stop_at_first_failure else "")
            try:
                proc = run_command(cmd, timeout * len(todo) + STARTUP_SECONDS, env=env, cwd=REPO)
                output, code = proc.stdout, proc.returncode
            except subprocess.TimeoutExpired as expired:  # the in-process limit could not act
                output, code = expired.output or "", None
            started, timed_out = _read_log(log, results)
            if timed_out is None and code is None:
                if not started:
                    raise RuntimeError(f"pytest started no grader in {timeout * len(todo) + STARTUP_SECONDS:.0f} s:\n"
                                       f"{output[-3000:]}")
                timed_out = started[-1]
            if timed_out is None:
                if code not in (0, 1, 5):  # passed, some failed, none selected; else pytest itself broke
                    raise RuntimeError(f"pytest stopped with exit status {code}:\n{output[-3000:]}")
                break
            results[timed_out].timed_out = timeout
            todo = [e for e in todo if e not in started]
            if not todo:
                break
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


def print_summary(results, title=None, out=None, impl="", collectives="library"):
    out = out or sys.stdout
    if title:
        print(f"== {title}", file=out)
    for r in results.values():
        detail = f"{r.passed}/{r.total} tests"
        if r.status == "not yet":
            detail += " (stubs still raise NotImplementedError)"
        if r.status == "timed out":
            detail = (f"stopped after {r.timed_out:g} s, {r.passed} passed and {r.failed} failed of "
                      f"{r.collected or '?'} tests")
        print(f"  {r.exercise} {EXERCISES[r.exercise][0]:<34} {r.status:<8} {detail}", file=out)
        if r.status == "timed out":
            print(f"      its graders ran past the {r.timed_out:g}-second limit (--timeout): a function that never\n"
                  "      returns (a loop that never ends, a recv no rank sends to) or a very slow one; the other\n"
                  "      exercises were graded without it", file=out)
            if r.first_failure:
                print(f"      first failure before that: {r.first_failure}", file=out)
            print(f"      re-run it alone (pytest stops a test after 120 s and shows where it was):\n"
                  f"        {rerun_command(r.exercise, impl, collectives)}", file=out)
        if r.status == "failing":
            print("      first failure:", file=out)
            for line in _message_lines(r.first_failure_message or r.first_failure):
                print(f"        {line}", file=out)
            print(f"      re-run it alone: {rerun_command(r.exercise, impl, collectives)}", file=out)


def exit_status(results):
    """1 if any graded exercise failed, timed out or collected no tests, else 0: "not yet" is no failure."""
    return int(any(r.status in ("failing", "timed out", "no tests") for r in results))


def print_totals(results, out=None):
    out = out or sys.stdout
    counts = {status: sum(r.status == status for r in results) for status in ("passed", "not yet", "failing")}
    timed_out = sum(r.status == "timed out" for r in results)
    if timed_out:
        counts["timed out"] = timed_out
    verdict = "some failed" if exit_status(results) else "nothing failed"
    print(f"{verdict} (exercise gradings: " + ", ".join(f"{n} {status}" for status, n in counts.items()) + ")",
          file=out)


ON_YOUR_RING = ("ex03", "ex04", "ex05a", "ex05b")  # the exercises whose graders run on ex02's collectives
_NOT_GRADED = ExerciseResult("none")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("submissions", nargs="*", help="directories to grade (default: exercises/)")
    parser.add_argument("--reference", action="store_true", help="grade the library's own code")
    parser.add_argument("--exercise", action="append", choices=sorted(EXERCISES), help="only these")
    parser.add_argument("--csv", help="also write one row per submission and exercise to this file")
    parser.add_argument("--timeout", type=float, default=EXERCISE_TIMEOUT, metavar="SECONDS",
                        help=f"stop an exercise whose graders run longer and report it as timed out "
                             f"(default {EXERCISE_TIMEOUT:g})")
    parser.add_argument("--collectives", choices=["library", "mine", "both"], default=None,
                        help="run Exercises 3-5 on the library's ring, on the ring of the graded "
                             "Exercise 2 (mine), or both (the default for your own exercises/)")
    args = parser.parse_args(argv)
    if not args.timeout > 0:
        parser.error(f"--timeout {args.timeout:g} must be a positive number of seconds")

    targets = ["reference"] if args.reference else (args.submissions or [""])
    collectives = args.collectives or ("both" if targets == [""] else "library")
    rows, graded = [], []
    for target in targets:
        if target not in ("", "reference") and not Path(target).is_dir():
            parser.error(f"{target} is not a directory")
        title = target or "exercises/ (your work)"
        first = "mine" if collectives == "mine" else "library"
        print(f"grading {title}: {len(args.exercise or EXERCISES)} exercise(s), each stopped after "
              f"{args.timeout:g} s ...", flush=True)
        results = run_graders(target, args.exercise, timeout=args.timeout, collectives=first)
        print_summary(results, title=title + (" on your own ring (ex02)" if first == "mine" else ""),
                      impl=target, collectives=first)
        graded += results.values()
        for r in results.values():
            rows.append([target or "exercises", r.exercise, r.status, r.passed, r.total, r.first_failure])
        built_on = [e for e in ON_YOUR_RING if e in results and results[e].status != "not yet"]
        if collectives == "both" and built_on and results.get("ex02", _NOT_GRADED).status == "passed":
            mine = run_graders(target, built_on, timeout=args.timeout, collectives="mine")
            print_summary(mine, title=f"{title}: Exercises 3-5 again, on YOUR ring collectives from ex02",
                          impl=target, collectives="mine")
            graded += mine.values()
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            csv.writer(f).writerows([["submission", "exercise", "status", "passed", "total", "first failure"], *rows])
    print_totals(graded)
    return exit_status(graded)


if __name__ == "__main__":
    sys.exit(main())
