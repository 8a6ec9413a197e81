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
