"""make grade's summary: the first failure whole (wrapped at word boundaries), its hint, and the re-run command."""
import io

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
