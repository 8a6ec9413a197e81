"""make grade's summary: the first failure whole (wrapped at word boundaries), its hint, and the re-run command;
an exercise that never returns is stopped and reported as timed out."""
import io
import re
import shutil
import time
from pathlib import Path

import pytest

from tp_from_scratch.tools.grade import ExerciseResult, _message_lines, print_summary, rerun_command


def test_a_long_message_is_wrapped_between_words_and_stops_before_the_rank_traceback():
    words = [f"word{i}" for i in range(30)]  # stays under MAX_MESSAGE_LINES
    message = "deadlock: " + " ".join(words) + "\n\nwhere each rank stopped:\n  rank 0: ring.py:12 in f\n" \
              "\ntraceback on rank 0:\n  File x.py"
    lines = _message_lines(message, width=40)
    assert all(len(line) <= 44 for line in lines)
    text = " ".join(" ".join(lines).split())
    assert all(w in text.split() for w in words), "a word was cut"
    assert "rank 0: ring.py:12 in f" in text and "File x.py" not in text


def test_a_failing_exercise_shows_its_hint_and_how_to_rerun_it():
    result = ExerciseResult("ex03", passed=3, failed=1, first_failure="test_row: AssertionError: y",
                            first_failure_message="test_row: AssertionError: y off\nHint: add the bias once")
    out = io.StringIO()
    print_summary({"ex03": result}, out=out, collectives="mine")
    text = out.getvalue()
    assert "Hint: add the bias once" in text
    assert "TP_COLLECTIVES=mine .venv/bin/python -m pytest exercises -m ex03 -x" in text
    assert rerun_command("ex03") == ".venv/bin/python -m pytest exercises -m ex03 -x"


def _results(**statuses):
    """{exercise: ExerciseResult} with the given status each ("passed", "not yet", "failing")."""
    counts = {"passed": dict(passed=2), "not yet": dict(failed=2, not_implemented=2),
              "failing": dict(passed=1, failed=1)}
    return {e: ExerciseResult(e, **counts[status]) for e, status in statuses.items()}


def test_make_grade_exits_0_while_exercises_are_not_yet_started_and_1_when_one_fails(monkeypatch, capsys):
    from tp_from_scratch.tools import grade

    skipped_ahead = _results(ex01="not yet", ex02="not yet", ex07="passed", ex08="passed")
    one_wrong = _results(ex01="not yet", ex07="passed", ex08="failing")
    for results, status in [(skipped_ahead, 0), (one_wrong, 1)]:
        monkeypatch.setattr(grade, "run_graders", lambda *args, results=results, **kwargs: results)
        assert grade.main(["--collectives", "library"]) == status
    out = capsys.readouterr().out
    assert "nothing failed (exercise gradings: 2 passed, 2 not yet, 0 failing)" in out
    assert "some failed (exercise gradings: 1 passed, 1 not yet, 1 failing)" in out


@pytest.mark.slow  # two grader subprocesses: not in make test-fast
@pytest.mark.timeout(300)
def test_an_exercise_that_never_returns_is_timed_out_and_the_others_are_still_graded(tmp_path, capsys):
    # Exercise 1's shard loops forever; Exercise 10 (the library's) comes after it. Each
    # exercise gets 3 s here: ex01 must read "timed out" (with the tests it finished), ex10
    # must still be graded and pass, and make grade must print both and exit 1
    from tp_from_scratch.tools import grade

    shutil.copy(Path(__file__).parent / "known_wrong" / "hangs" / "ex01_split_matmul.py", tmp_path)
    (tmp_path / "ex10_recursive_halving_doubling.py").write_text(
        "from tp_from_scratch.overlap.algorithms import *  # noqa: F401,F403\n")
    start = time.monotonic()
    status = grade.main([str(tmp_path), "--exercise", "ex01", "--exercise", "ex10", "--timeout", "3"])
    elapsed = time.monotonic() - start
    out = capsys.readouterr().out
    assert status == 1, out
    assert re.search(r"ex01 ex01_split_matmul +timed out +stopped after 3 s, \d+ passed and \d+ failed of \d+ tests", out), out
    assert re.search(r"ex10 ex10_recursive_halving_doubling +passed", out), out
    assert "some failed (exercise gradings: 1 passed, 0 not yet, 0 failing, 1 timed out)" in out, out
    assert elapsed < 120, f"grading took {elapsed:.0f} s: the 3-second limit did not stop ex01"
