"""Handles returned by the ``*_async`` collectives (the blocking forms wait on one too).

A user holds a ``Handle`` (``poll``, ``synchronize``, ``add_done_callback``). The engine
works it through this module's functions: ``complete`` and ``succeed`` (on the engine's
thread), ``sleep_on`` (a waiting caller's thread), and ``set_finisher`` (the submitting
call, for what ``synchronize`` does to the result on the caller's thread).
"""
import threading
from typing import Any, Callable, List, Optional

from .base.log import logger
from .base.tracebacks import short

_SLEEPERS = threading.Lock()  # orders completing a handle against a thread going to sleep on it


class Handle:
    """A request in the engine. ``poll()`` says whether it finished; ``synchronize()`` waits
    and returns what the blocking form of the collective would have returned (or raises its
    error, the same on every rank)."""

    __slots__ = ("_engine", "_event", "_result", "_error", "_done", "_finish", "_callbacks")

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._event: Optional[threading.Event] = None  # made by the first thread to sleep
        self._result: Any = None
        self._error: Optional[BaseException] = None
        self._done = False
        # applied once to the result by synchronize(), on the caller's thread (GPU arrays:
        # stream ordering and the caller's kind of array)
        self._finish: Optional[Callable[[Any], Any]] = None
        self._callbacks: Optional[List[Callable[[], None]]] = None  # add_done_callback's

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the handle is complete: at once if it is, otherwise on
        the thread that completes it (the engine's: keep it short, and never wait there for
        another request)."""
        with _SLEEPERS:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                return
        callback()

    def poll(self) -> bool:
        """True once the result is there; never blocks."""
        return self._done

    def synchronize(self) -> Any:
        """Wait for completion and return the result (the same object on repeated calls)."""
        engine = self._engine
        if engine is not None and not self._done:
            engine.wait(self)
        if self._error is not None:
            raise self._error
        if self._finish is not None:
            self._result, self._finish = self._finish(self._result), None
        return self._result


def complete(handle: Handle, result: Any, error: Optional[BaseException]) -> None:
    """Give ``handle`` its result, or its error; wake its waiters and run its callbacks."""
    handle._result, handle._error = result, error
    with _SLEEPERS:
        handle._done = True
        event, callbacks = handle._event, handle._callbacks
        handle._callbacks = None
    handle._engine = None
    if event is not None:
        event.set()
    for callback in callbacks or ():
        try:
            callback()
        except Exception:  # the completing thread (the engine's) must go on
            logger.exception("hvdlike: a handle's done callback raised")


def succeed(handle: Handle, result: Any) -> None:
    complete(handle, result, None)


def sleep_on(handle: Handle, timeout: float) -> None:
    """Sleep until ``handle`` completes or ``timeout`` seconds pass."""
    with _SLEEPERS:
        if handle._done:
            return
        if handle._event is None:
            handle._event = threading.Event()
        event = handle._event
    event.wait(timeout)


def set_finisher(handle: Handle, finish: Callable[[Any], Any]) -> None:
    """Have ``synchronize`` apply ``finish`` once to the result, on the caller's thread."""
    handle._finish = finish


def _check(handle: Any, what: str) -> None:
    if not isinstance(handle, Handle):
        raise TypeError(f"hvdlike.{what} takes the handle that an *_async call returned (e.g. "
                        f"hvdlike.allreduce_async), got {type(handle).__name__}")


def poll(handle: Handle) -> bool:
    """True once the async operation behind ``handle`` has completed."""
    _check(handle, "poll")
    return handle.poll()


@short
def synchronize(handle: Handle) -> Any:
    """Wait for the async operation behind ``handle`` and return its result."""
    _check(handle, "synchronize")
    return handle.synchronize()
