"""The stall inspector: say which ranks a collective is waiting for, and optionally end the job.

A collective that some ranks never submit (an extra step on one rank, a skipped batch, a rank
stuck in its input pipeline) would leave the others waiting forever. Once a second or so
(never on the latency path) the engine looks at this rank's own pending requests; when one has
waited past the first of the times below, it asks for every rank's row in the next round
(which says who has which request) and then:

* waiting ``HVDLIKE_STALL_CHECK_TIME_SECONDS`` (default 60): log once, per request, which
  ranks have not submitted it;
* waiting ``HVDLIKE_STALL_SHUTDOWN_TIME_SECONDS`` (default 0 = never): flag it in this rank's
  next round. Every rank sees the flag in the same round, gathers every rank's stalled
  requests, prints the same report and exits with status 1.

A round that gets no answer at all from some rank (its process stopped, or its Python is
stuck in native code without releasing the GIL, so its engine cannot take part) is reported by
the exchange itself: a warning after the check time and, ``LONE_EXIT_GRACE`` seconds past the
shutdown time, this rank exits alone and the MPI launcher ends the others. The grace keeps the
shared report first: Open MPI over TCP can hold one rank's round for seconds while the others
have moved on (seen with the cores oversubscribed, in a job's first rounds), and a lone exit
then would end the job without the report.
"""
import os
import sys
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..base import death_notice
from ..base.log import logger
from . import timeline

_MAX_LISTED = 10
LONE_EXIT_GRACE = 10.0  # seconds past the shutdown time before a round without answer exits
_UNNAMED = ("requests named 'noname.<k>' were submitted without a name: they pair up by the "
            "order of each rank's unnamed calls on a process set, so a rank that made one "
            "unnamed call more or fewer than the others (or made them from several threads) "
            "leaves the ranks waiting on different numbers; pass name= to such calls")


class Stalled(NamedTuple):
    """One request this rank has been waiting for."""

    rank: int
    kind: str
    name: str
    process_set: int
    waited: float  # seconds
    missing: List[int]  # member ranks that have not submitted it
    joined: Tuple[int, ...] = ()  # those of them that have called hvdlike.join()


def describe(stalled: Sequence[Stalled]) -> str:
    """One clause per stalled request, naming the ranks that wait and the ranks missing."""
    groups: Dict[Tuple[str, str, int, Tuple[int, ...], Tuple[int, ...]], List[Stalled]] = {}
    for s in stalled:
        groups.setdefault((s.kind, s.name, s.process_set, tuple(s.missing), s.joined),
                          []).append(s)
    clauses = []
    for (kind, name, set_id, missing, joined), group in list(groups.items())[:_MAX_LISTED]:
        ranks = sorted({s.rank for s in group})
        who = f"rank {ranks[0]} has" if len(ranks) == 1 else f"ranks {ranks} have"
        where = "" if set_id == 0 else f" on process set {set_id}"
        clauses.append(f"{who} waited {max(s.waited for s in group):.1f} s for {kind} "
                       f"{name!r}{where}, which ranks {list(missing)} have not submitted")
        if joined:  # join stands in for all-reduces on the global set only
            clauses[-1] += (f" (ranks {list(joined)} have called hvdlike.join(), which takes "
                            "part only in all-reduces on the global process set)")
    if len(groups) > _MAX_LISTED:
        clauses.append(f"... and {len(groups) - _MAX_LISTED} more")
    if any(s.name.startswith("noname.") for s in stalled):
        clauses.append(_UNNAMED)
    return "; ".join(clauses)


class StallInspector:
    def __init__(self, settings: Any, rank: int) -> None:
        self.enabled = settings.stall_check
        self.check = settings.stall_check_time
        self.shutdown = settings.stall_shutdown_time
        self.first_check = min(self.check, self.shutdown or self.check)  # seconds
        self.interval = max(0.05, min(1.0, self.first_check / 4))
        self.rank = rank
        self.next_scan = time.perf_counter() + self.interval
        self.flag = False  # this rank has waited past the shutdown time: say so in its row

    def due(self, now: float) -> bool:
        return self.enabled and now >= self.next_scan

    def scan(self, entries: Sequence[Any], missing: Callable[[Any], List[int]],
             now: float, joined: Sequence[int] = ()) -> None:
        """Look at this rank's pending requests (engine entries); warn about the ones waiting
        past the check time (once each); flag this rank if one waits past the shutdown time.
        ``joined``: the ranks that have called hvdlike.join()."""
        self.next_scan = now + self.interval
        stalled = self.stalled(entries, missing, now, self.first_check, joined)
        warn = []
        for entry, s in stalled:
            if s.waited >= self.check and not entry.warned:
                entry.warned = True
                warn.append(s)
        if warn:
            ending = ("" if self.shutdown else " Nothing ends the job for this: set "
                      "HVDLIKE_STALL_SHUTDOWN_TIME_SECONDS to end it after that many seconds "
                      "of such a wait.")
            logger.warning("stalled: %s. Those ranks may be skipping this collective or be "
                           "stuck before it (HVDLIKE_STALL_CHECK_TIME_SECONDS=%g).%s",
                           describe(warn), self.check, ending)
        self.flag = bool(self.shutdown) and any(s.waited >= self.shutdown for _, s in stalled)

    def stalled(self, entries: Sequence[Any], missing: Callable[[Any], List[int]], now: float,
                least: float, joined: Sequence[int] = ()) -> List[Tuple[Any, Stalled]]:
        """This rank's requests that have waited at least ``least`` seconds for members that
        have not submitted them."""
        out = []
        for entry in entries:
            waited = now - entry.submitted
            if waited >= least:
                absent = missing(entry)
                if absent:
                    out.append((entry, Stalled(self.rank, entry.request.kind,
                                               entry.request.name or "", entry.key[0], waited,
                                               absent, tuple(r for r in absent if r in joined))))
        return out

    def report(self, entries: Sequence[Any], missing: Callable[[Any], List[int]],
               now: float, joined: Sequence[int] = ()) -> List[Stalled]:
        """What this rank contributes to the shutdown report: its requests stalled about as
        long as the one that triggered it (whose rank scanned up to an interval earlier)."""
        least = self.first_check - self.interval
        return [s for _, s in self.stalled(entries, missing, now, least, joined)]

    def exchange_waited(self, waited: float, warned: bool) -> bool:
        """A round's exchange has had no answer from some rank for ``waited`` seconds: warn
        once (returns True once warned), and exit ``LONE_EXIT_GRACE`` past the shutdown time."""
        if not self.enabled:
            return warned
        what = (f"the engine's round has had no answer from some rank for {waited:.0f} s: "
                "a rank has stopped, is still inside hvdlike.exclusive_mpi(), or its Python is "
                "stuck in native code that holds the GIL, so its engine cannot take part")
        if self.shutdown and waited >= self.shutdown + LONE_EXIT_GRACE:
            exit_now(self.rank, f"stall shutdown (HVDLIKE_STALL_SHUTDOWN_TIME_SECONDS="
                                f"{self.shutdown:g}): {what}")
        if waited >= self.check and not warned:
            logger.warning("stalled: %s (HVDLIKE_STALL_CHECK_TIME_SECONDS=%g).", what,
                           self.check)
            return True
        return warned

    def shut_down(self, reports: Sequence[Sequence[Stalled]], barrier: Callable[[], None]
                  ) -> None:
        """Every rank, in the same round: print the gathered report and exit with status 1."""
        stalled = [s for report in reports for s in report]
        exit_now(self.rank, f"stall shutdown (HVDLIKE_STALL_SHUTDOWN_TIME_SECONDS="
                            f"{self.shutdown:g}): {describe(stalled)}. Every rank exits.",
                 barrier)


def exit_now(rank: int, message: str, barrier: Optional[Callable[[], None]] = None,
             linger: float = 0.0, reason: str = "") -> None:
    """Print ``message`` on stderr, save the timeline, wait for the other ranks (``barrier``)
    so that each prints its message before the launcher ends the job, tell hvdlikerun why
    (``reason``, default ``message``: its death watch), wait ``linger`` seconds more, and
    exit with 1."""
    sys.stderr.write(f"hvdlike[{rank}]: ERROR: {message}\n")
    sys.stderr.flush()
    tl = timeline.current
    if tl is not None:
        tl.close()
    if barrier is not None:
        barrier()
    death_notice.quiet(ending=True, reason=reason or message)  # this rank said why it ends
    time.sleep(linger)
    os._exit(1)
