"""What can go wrong between ranks, as exception classes a learner can read and a test can catch.

CommError and its subclasses are raised *on a rank* by a communicator: a deadlock, a wait that
ran out of time, ranks that disagree about which collective they are in. SPMDError is raised
*in the caller* of run_spmd when any rank failed; it names the rank and carries its traceback.
"""


class CommError(RuntimeError):
    """A communication failure seen on one rank (base class)."""


class DeadlockError(CommError):
    """Every live rank waits for something that no rank will ever do."""


class CommTimeoutError(CommError, TimeoutError):
    """A blocking wait (recv, barrier, process-group setup) ran past its timeout."""


class CollectiveMismatchError(CommError):
    """Ranks called different collectives, or the same one with different shapes/dtypes/roots."""


class SPMDError(RuntimeError):
    """Raised by run_spmd in the caller when a rank failed.

    Attributes: ``rank`` (the rank that failed first), ``error`` (its exception object) and
    ``traceback`` (the text of its traceback, as printed on that rank).
    """

    def __init__(self, message, rank=None, error=None, traceback=""):
        super().__init__(message)
        self.rank = rank
        self.error = error
        self.traceback = traceback


class RankStopped(BaseException):
    """Raised inside a simulated rank to stop it because another rank failed.

    A BaseException, so that a learner's ``except Exception`` cannot swallow it.
    """
