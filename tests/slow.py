"""The one switch between `make test` and `make test-slow`: TP_TEST_SLOW=1, which `make test-slow` sets.

A test file that holds a launch or a longer run back from `make test` imports from here, never reads
the variable itself, and says in its docstring or reason where `make test` still holds the claim.
The Makefile's test-slow target runs every test file that imports this module (it finds them by
that import), so a test marked here is never left out of both targets.
"""
import os

import pytest

SLOW = os.environ.get("TP_TEST_SLOW") == "1"


def only_in_test_slow(why):
    """The mark that skips a test outside `make test-slow`; `why` says why it does not fit `make test`."""
    return pytest.mark.skipif(not SLOW, reason=f"{why}: run `make test-slow`")
