"""Errors about the caller's input, raised from the public function the caller called.

hvdlike checks a collective deep in its engine and TensorFlow bridge; a traceback through
them, and the exception TensorFlow's error class is made from, chained before it, say
nothing the message does not. A public function wrapped with ``short`` re-raises such an
error (``ValueError``, ``TypeError``, ``NotInitializedError``, ``DeadlockError``, and errors
hvdlike marked with ``mark``) from its own frame: one hvdlike frame below the caller's, no
chain. ``HVDLIKE_FULL_TRACEBACKS=1`` keeps everything (to report a bug in hvdlike).
"""
import functools
import os
from typing import Any, Callable, TypeVar

from .errors import DeadlockError, NotInitializedError

_F = TypeVar("_F", bound=Callable[..., Any])
_SHORTENED = (ValueError, TypeError, NotInitializedError, DeadlockError)
_FULL = os.environ.get("HVDLIKE_FULL_TRACEBACKS", "0") not in ("", "0")


def mark(error: BaseException) -> BaseException:
    """``error`` (another class, e.g. TensorFlow's), to be shortened as a caller's error."""
    error.hvdlike_short = True  # type: ignore[attr-defined]
    return error


def short(fn: _F) -> _F:
    """``fn``, raising the caller's errors from its own frame (see the module)."""
    if _FULL:
        return fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            if not (isinstance(exc, _SHORTENED) or getattr(exc, "hvdlike_short", False)):
                raise
            exc.__cause__ = None
            raise exc.with_traceback(None) from None
    return wrapper  # type: ignore[return-value]
