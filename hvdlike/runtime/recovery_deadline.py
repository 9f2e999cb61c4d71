"""A deadline on the elastic recovery after ranks died (ULFM): Open MPI now and then does not
return from one of its steps (docs/reliability.md). A rank still recovering after
``HVDLIKE_ELASTIC_RECOVERY_TIMEOUT`` seconds says which step it is in, prints its threads'
stacks and exits with status 1, so that the job ends instead of hanging."""
import faulthandler
import os
import sys
import threading
from typing import Mapping

from ..base import death_notice, log
from ..base.env_values import read_seconds

VARIABLE = "HVDLIKE_ELASTIC_RECOVERY_TIMEOUT"
DEFAULT_SECONDS = 120.0


def seconds(env: Mapping[str, str]) -> float:
    """The deadline in seconds (0: none)."""
    return read_seconds(env, VARIABLE, DEFAULT_SECONDS, zero=True)


class RecoveryDeadline:
    """Started when a rank begins to recover; ``step(what)`` names what it does now;
    ``done()`` ends the deadline. Past it, the rank exits (a timer thread: mpi4py lets go of
    the interpreter while MPI runs)."""

    def __init__(self, who: str, limit: float) -> None:
        self.who, self.limit, self.what = who, limit, "starting"
        self._timer = threading.Timer(limit, self._expired) if limit > 0 else None
        if self._timer is not None:
            self._timer.daemon = True
            self._timer.start()

    def step(self, what: str) -> None:
        self.what = what
        log.logger.debug(f"elastic: {what}")

    def done(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _expired(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(2, (f"hvdlike: {self.who}: the elastic recovery after ranks died is still in "
                     f"{self.what} after {self.limit:g} s (MPI did not return); this rank "
                     f"exits with status 1 so that the job ends instead of hanging. Under "
                     f"hvdlikerun --restarts the job starts again from its committed state; "
                     f"{VARIABLE} sets the deadline. Where it was:\n").encode())
        faulthandler.dump_traceback(all_threads=True)
        death_notice.quiet(ending=True)  # it said why it ends
        os._exit(1)
