"""Known-wrong, and worse: shard never returns (a loop whose condition never changes), so the
graders never finish. `make grade` must stop this exercise after its time limit, report it as
"timed out", and grade the others all the same (tests/test_grade_summary.py). It lives apart
from tests/known_wrong/<exercise>/, whose files the meta-tests grade to their first failure.
"""
from tp_from_scratch.matmul import column_parallel_matmul, row_parallel_matmul, sum_partials  # noqa: F401
from tp_from_scratch.sharding import unshard  # noqa: F401


def shard(array, world_size, axis):
    rows, done = 0, False
    while not done:  # meant to be set once every shard is cut
        rows += 1
    return rows
