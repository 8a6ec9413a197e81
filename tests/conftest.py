"""Shared pytest setup for tests/: a fixed hypothesis profile so property tests are reproducible.

The "ci" profile (the default here) derandomizes hypothesis: the same examples run on every
machine and every run, so a failure is never a fluke of the day. Select another profile with
`pytest --hypothesis-profile=dev` (more examples, random) when hunting for bugs locally.
"""
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, max_examples=10, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile("ci")


# The files that take longest, longest first (seconds on 2 busy cores, `--durations=0`, 2026-12-05).
# `make test` runs files whole on 2 workers (--dist loadfile) in collection order
# (--no-loadscope-reorder): the long ones started first, the short ones fill in behind them, so
# neither worker is left running one long file alone at the end. pytest-xdist's own order (most
# tests first) started the website's build and the training launches last. A file missing here
# only runs later; the order never changes what a test proves.
LONGEST_FIRST = [
    "test_site.py",              # ~260 s: the site's build, then a browser reading every page
    "test_graders.py",           # ~210 s: every known-wrong implementation graded
    "test_verify.py",            # ~200 s: two launches of python -m tp_from_scratch.verify
    "test_trainer_options.py",   # ~110 s: one torchrun launch per trainer
    "test_train.py",             # ~90 s
    "06_training.ipynb",         # ~50 s alone, ~100 s in the suite; the other notebooks right after it
    "test_sp_training_torchrun.py", "test_pipeline_launch.py", "test_failures_comm.py",
    "test_deepseek_train.py", "test_verify_model.py", "test_commands.py", "test_dcp_launched.py",
    "test_doctor.py", "test_deepseek_moe.py", "test_parallelisms.py", "test_numerics_launch.py",
    "test_numerics_clip.py", "test_collectives_native.py", "test_plan.py", "test_dcp.py",
]


# make test runs the lessons' notebooks in the same session (Makefile): each is one unit of 10 to
# 100 s, so they start early, after Lesson 6's, rather than last, where the slowest of them would
# be the only thing left running
NOTEBOOKS = LONGEST_FIRST.index("06_training.ipynb") + 0.5


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, NOTEBOOKS if item.path.suffix == ".ipynb" else len(rank)))
    # (sort is stable: each file's own order kept)
