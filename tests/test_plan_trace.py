"""bench scaling --trace's accounting of a profiled step, on hand-made intervals (no profiler run).

Every moment of a step gets exactly one kind (communication before matmul before copy before
other ops; "python" where no op runs), so the kinds add up to the step; a blocking all-reduce's
transfer is the shortest duration over the ranks, the rest of a rank's time in it is waiting.
"""
import pytest

from tp_from_scratch.bench.scaling import coarse, kind_of, paint, split_waiting


def test_kinds_of_profiler_events():
    assert kind_of("gloo:all_reduce") == kind_of("c10d::allreduce_") == "communication"
    assert kind_of("aten::mm") == kind_of("aten::addmm") == kind_of("aten::bmm") == "matmul"
    assert kind_of("aten::clone") == "copy"
    assert kind_of("aten::gelu") == "other ops"
    assert kind_of("step") is None and kind_of("ReduceFromTensorParallelRegion") is None


def test_paint_gives_each_moment_one_kind_and_adds_up_to_the_step():
    intervals = [(0, 40, "other ops"),          # an op enclosing a matmul and a copy
                 (10, 30, "matmul"), (30, 35, "copy"),
                 (50, 70, "communication"),     # the all-reduce on gloo's thread...
                 (48, 52, "other ops"),         # ...overlapping the op that started it
                 (65, 75, "matmul"),            # and a matmul it overlaps: the all-reduce claims 65-70
                 (90, 120, "matmul")]           # runs past the step's end: cut at 100
    segments = paint(intervals, 0, 100)
    assert segments == [(0, 10, "other ops"), (10, 30, "matmul"), (30, 35, "copy"), (35, 40, "other ops"),
                        (40, 48, "python"), (48, 50, "other ops"), (50, 70, "communication"),
                        (70, 75, "matmul"), (75, 90, "python"), (90, 100, "matmul")]
    assert sum(b - a for a, b, _ in segments) == 100


def test_transfer_is_the_shortest_duration_over_the_ranks_and_the_rest_is_waiting():
    # two all-reduces; rank 0 arrived first at the first (waited 6 ms), rank 1 at the second
    step = {"seconds": {"communication": 0.020}, "collectives_s": [0.010, 0.004],
            "collectives_all_ranks_s": [[0.010, 0.004], [0.004, 0.007]]}
    split_waiting(step)
    s = step["seconds"]
    assert s["communication: transfer"] == pytest.approx(0.008)
    assert s["communication: waiting for the other rank"] == pytest.approx(0.006)
    assert s["communication: starting the call"] == pytest.approx(0.006)
    assert "collectives_all_ranks_s" not in step


def test_coarse_timeline_joins_short_and_equal_neighbours():
    segments = [(0.0, 1.0, "matmul"), (1.0, 1.01, "python"), (1.01, 2.0, "matmul"), (2.0, 3.0, "copy")]
    assert coarse(segments) == [[0.0, 2.0, "matmul"], [2.0, 3.0, "copy"]]
