"""A request this rank submitted, as the engine keeps it until its response has run."""
import time
from typing import Any, Optional

from ..handles import Handle
from .checks import LocalError, Request
from .rounds import Key

NONAME_NAMES = 256  # unnamed requests cycle through this many names (see ``engine``)
NONAMES = tuple(f"noname.{k}" for k in range(NONAME_NAMES))


class Entry:
    """A request this rank submitted, until its response has run."""

    __slots__ = ("key", "request", "error", "inputs", "process_set", "handle", "position",
                 "warned", "submitted", "carried", "negotiated")

    def __init__(self, request: Request, error: Optional[LocalError], inputs: Any,
                 process_set: Any, handle: Handle) -> None:
        self.key: Key = (process_set.process_set_id, request.name or "")
        self.request, self.error, self.inputs = request, error, inputs
        self.process_set, self.handle = process_set, handle
        self.position: Optional[int] = None  # cache position whose bit this entry sets
        self.warned = False  # the stall inspector has reported it
        # perf_counter times: submitted; start and end of the first round that carried it
        self.submitted = time.perf_counter()
        self.carried = self.negotiated = 0.0
