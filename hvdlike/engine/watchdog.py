"""The collective watchdog: a thread of its own, never inside MPI, that sees a collective stuck
there.

A thread inside an MPI call runs no Python until the call returns, and over TCP a call whose
peer's host has lost its network, or is frozen, may never return: Open MPI retries, the
engine's own checks (the stall inspector) never run. So the engine tells the watchdog what it
is about to do inside MPI (``enter``: the round, or a bucket of collectives) and that it is
out again (``leave``); mpi4py releases the interpreter inside MPI calls, so this thread keeps
running and, for what has stayed inside MPI:

* after ``HVDLIKE_STALL_CHECK_TIME_SECONDS`` (a bucket, not a round, whose long waits the
  round's exchange reports itself): logs once which collective and which ranks and hosts it
  waits on;
* after ``HVDLIKE_COLLECTIVE_TIMEOUT_SECONDS`` (default 600, 0: never): prints the same on
  stderr, tells ``hvdlikerun`` (its death watch) and, ``REPORT_GRACE`` seconds later, ends
  this process (status 1), so that the MPI launcher ends the job (as PyTorch's NCCL watchdog
  does, with the same default: long enough for any collective a job means to run, a
  checkpoint's broadcast across a slow link included, and short of a lost hour).

Its cost to the engine: one tuple stored per round and per bucket; the thread wakes up to
once a second and looks at that tuple, whatever the size of the world.
"""
import threading
import time
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from ..base.death_notice import TIMED_OUT
from ..base.log import logger
from . import stall

ROUND = "round"  # ``enter``'s mark for the engine's round (its exchange and what follows)
# seconds a timed-out rank waits before it exits: the other ranks stuck in the same collective
# time out too and say so (hvdlikerun then names the ranks that said nothing) before the
# launcher, told of this rank's exit, ends them
REPORT_GRACE = 5.0
_HOSTS_LISTED = 8
_RANKS_LISTED = 16


class Watchdog:
    """``st``: the engine's world (settings, rank, ``node_of_rank``, ``host_of_node``);
    ``sets``: the process sets by id (their ``ranks``)."""

    def __init__(self, st: Any, sets: Mapping[int, Any]) -> None:
        settings = st.settings
        self.timeout = settings.collective_timeout
        self.warn_after = settings.stall_check_time if settings.stall_check else 0.0
        self._st, self._sets = st, sets
        self._current: Optional[Tuple[float, Any]] = None  # (since, what) while inside MPI
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        times = [t for t in (self.timeout, self.warn_after) if t > 0]
        if times and st.size > 1:
            self._interval = max(0.05, min(1.0, min(times) / 10))
            self._thread = threading.Thread(target=self._watch, name="hvdlike-watchdog",
                                            daemon=True)
            self._thread.start()

    def enter(self, what: Any) -> None:
        """The engine goes into MPI for ``what``: ``ROUND``, or the works of a bucket (each a
        ``Work`` or a ``(request, process_set)`` pair)."""
        self._current = (time.monotonic(), what)

    def leave(self) -> None:
        """The engine is out of MPI."""
        self._current = None

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        warned: Optional[Tuple[float, Any]] = None
        while not self._stop.wait(self._interval):
            current = self._current
            if current is None:
                continue
            since, what = current
            waited = time.monotonic() - since
            if self.timeout and waited >= self.timeout:
                reason = (f"{TIMED_OUT} (HVDLIKE_COLLECTIVE_TIMEOUT_SECONDS={self.timeout:g}): "
                          f"{self.describe(what, waited)}")
                stall.exit_now(self._st.rank, reason + (
                    ". A host that lost its network or is frozen, or a rank stuck outside "
                    "Python, holds every collective it is in. This rank ends so that the "
                    "launcher ends the job"), linger=REPORT_GRACE, reason=reason)
            if (self.warn_after and waited >= self.warn_after and what is not ROUND
                    and current is not warned):
                warned = current
                logger.warning("stalled: %s (HVDLIKE_STALL_CHECK_TIME_SECONDS=%g; the job ends "
                               "at HVDLIKE_COLLECTIVE_TIMEOUT_SECONDS=%g).",
                               self.describe(what, waited), self.warn_after, self.timeout)

    def describe(self, what: Any, waited: float) -> str:
        """What has been inside MPI, for how long, and which ranks and hosts it waits on."""
        if what is ROUND:
            ranks: Sequence[int] = range(self._st.size)
            text = ("the engine's round (the all-reduce that tells every rank which "
                    "collectives the others have ready)")
        else:
            pairs = [(w.request, w.process_set) if hasattr(w, "request") else w for w in what]
            request, process_set = pairs[0]
            names = [repr(r.name) for r, _ in pairs[:3]] + (["..."] if len(pairs) > 3 else [])
            set_id = process_set.process_set_id
            ranks = self._sets[set_id].ranks
            where = "the global process set" if set_id == 0 else f"process set {set_id}"
            text = (f"{request.kind} {', '.join(names)} ({_size(_bytes_of(what))}) on {where}")
        others = [r for r in ranks if r != self._st.rank]
        return (f"{text} has been inside MPI for {waited:.1f} s on rank {self._st.rank}, "
                f"waiting on ranks {_ranks_text(others)} on {_hosts_text(self._st, others)}")


def _bytes_of(works: Sequence[Any]) -> int:
    total = 0
    for work in works:
        inputs = work.inputs if hasattr(work, "inputs") else ()
        for a in inputs if isinstance(inputs, (list, tuple)) else [inputs]:
            total += int(getattr(a, "nbytes", 0))
    return total


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} bytes"


def _ranks_text(ranks: Sequence[int]) -> str:
    """``[0-3, 5, 8-15]``, at most ``_RANKS_LISTED`` runs."""
    runs: List[List[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    shown = [f"{a}-{b}" if b > a else str(a) for a, b in runs[:_RANKS_LISTED]]
    more = f", ... ({len(ranks)} ranks)" if len(runs) > _RANKS_LISTED else ""
    return "[" + ", ".join(shown) + more + "]"


def _hosts_text(st: Any, ranks: Sequence[int]) -> str:
    hosts: List[str] = []
    seen = set()
    for r in ranks:
        node = st.node_of_rank[r]
        if node not in seen:
            seen.add(node)
            hosts.append(st.host_of_node.get(node, f"the host of rank {node}"))
    if not hosts:
        return "no other host"
    shown = ", ".join(hosts[:_HOSTS_LISTED])
    more = f" and {len(hosts) - _HOSTS_LISTED} more" if len(hosts) > _HOSTS_LISTED else ""
    return ("host " if len(hosts) == 1 else "hosts ") + shown + more

