"""Exceptions raised by hvdlike."""
from typing import List


class NotInitializedError(ValueError):
    """A collective or query was called before ``hvdlike.init()``."""
    # built from its whole message, as ValueError: Keras re-creates an error raised in a
    # layer's call from the message with the call's context added


class CollectiveMismatchError(ValueError):
    """Ranks called the same collective with different arguments (shape, dtype, op, root, ...)."""


class RanksFailedError(RuntimeError):
    """Ranks of the job died (seen only where MPI survives a failure: Open MPI with ULFM,
    ``hvdlikerun --elastic``). Every collective pending or submitted afterwards on the
    survivors raises it; ``hvdlike.elastic.run`` catches it, shrinks the world and goes on.
    Horovod's name for it: ``HorovodInternalError``."""

    def __init__(self, message: str, failed: List[int]) -> None:
        super().__init__(message)
        # world ranks (of the world before the failure) that died; [] on a rank that heard
        # of it only from another survivor (ULFM's revoke), which does not say who
        self.failed = failed


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's signal that hosts were added or removed. hvdlike has no host discovery: it
    replaces dead ranks inside the reset that follows their death (``hvdlikerun --max-np``),
    so it never raises this; it exists so that Horovod code catching it ports."""


class DeadlockError(RuntimeError):
    """Every rank of a process set has been blocked waiting for
    ``HVDLIKE_DEADLOCK_SECONDS``, each for names that only the others could submit (rank 0
    waits for ``a``, which rank 1 submits only after its wait for ``b`` ends, and rank 1 for
    ``b``, which rank 0 submits only after ``a``). Raised on each of those ranks from the
    call that waits, with the same message naming, per rank, what it waits for and which ranks
    have not submitted it."""

    def __init__(self, message: str, ranks: List[int]) -> None:
        super().__init__(message)
        self.ranks = ranks  # the deadlocked world ranks
