"""Handles returned by the ``*_async`` collectives."""
from typing import Any, Callable, List


class Handle:
    """An operation in flight. ``poll()`` says whether it finished; ``synchronize()`` waits and
    returns what the blocking form of the collective would have returned."""

    __slots__ = ("_mpi", "_requests", "_finish", "_result", "_done")

    def __init__(self, mpi: Any, requests: List[Any], finish: Callable[[], Any]) -> None:
        self._mpi, self._requests, self._finish = mpi, requests, finish
        self._done = False
        self._result: Any = None

    def poll(self) -> bool:
        """True once the data has arrived; never blocks."""
        return self._done or bool(self._mpi.Request.Testall(self._requests))

    def synchronize(self) -> Any:
        """Wait for completion and return the result (the same object on repeated calls)."""
        if not self._done:
            if self._requests:
                self._mpi.Request.Waitall(self._requests)
            self._result = self._finish()
            self._done = True
            self._requests = []
        return self._result


def poll(handle: Handle) -> bool:
    """True once the async operation behind ``handle`` has completed."""
    return handle.poll()


def synchronize(handle: Handle) -> Any:
    """Wait for the async operation behind ``handle`` and return its result."""
    return handle.synchronize()
