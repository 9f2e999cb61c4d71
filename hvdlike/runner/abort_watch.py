"""Ending a job that the MPI said it is aborting but that does not end.

Open MPI prints a notice when a rank calls ``MPI_Abort`` (hvdlike does on an uncaught
exception) or meets an error under ``MPI_ERRORS_ARE_FATAL``, then tears the job down. Rarely
the teardown never finishes: once, after a rank on another host was killed, the job hung with
that notice as its last output (docs/reliability.md). ``hvdlikerun`` passes the job's output
through an ``OutputWatch``; when a notice has appeared and the job is still running after the
grace period, it ends the job; the same after rank 0 of an elastic job that lost ranks said
that every rank has shut down (``ELASTIC_DONE``: the launcher may wait for ranks on a host it
cannot reach, or frozen ones), and after the launcher's own word that the job ends
(``LAUNCHER_ENDS``), elastic or not. It also keeps the lines in which hvdlike names a rank that
died without its shutdown (``hvdlike.base.death_notice``); hvdlikerun repeats the one with
the earliest time of death as the job's last line. The same watch can leave some lines out
of a stream (``drop``: TensorFlow's start-up lines, ``startup_noise``).
"""
import os
import re
import threading
import time
from typing import BinaryIO, Callable, List, Optional, Tuple

from ..base.death_notice import ELASTIC_DONE, ENDED

NOTICES = (b"MPI_ERRORS_ARE_FATAL", b"MPI_ABORT was invoked")
# Open MPI's launcher (prterun, mpirun) has decided the job is over ("prterun has exited due
# to process rank 0 ... calling abort") and may still wait for a daemon it cannot reach
LAUNCHER_ENDS = b"has exited due to process rank"
_DONE = ELASTIC_DONE.encode()
# bytes kept to see a notice split in two
_TAIL = max(len(n) for n in NOTICES + (_DONE, LAUNCHER_ENDS)) - 1
_ENDED = ENDED.encode()
_DEATH = re.compile(rb"^hvdlike: rank \d+ of \d+ \(pid \d+ on host .*\) " + re.escape(_ENDED)
                    + rb"(?: \(t=([\d.]+)\))?.*$", re.M)
_TIME = re.compile(rb" \(t=[\d.]+\)")
_LINE = 4096  # bytes of an unfinished line kept to look for the death notice in


class OutputWatch:
    """Copies a child's stdout and stderr to ours, and notes when an abort notice went by
    (``seen_at``, a ``time.monotonic()``)."""

    def __init__(self) -> None:
        self.seen_at: Optional[float] = None
        self.done_at: Optional[float] = None  # when an elastic job said every rank shut down
        self.ends_at: Optional[float] = None  # when the launcher said the job ends
        self._deaths: List[Tuple[float, int, str]] = []  # (time of death, order, line)
        self._threads: List[threading.Thread] = []

    def follow(self, source: BinaryIO, target: BinaryIO,
               drop: Optional[Callable[[bytes], bool]] = None) -> None:
        """Copy ``source`` to ``target`` on a thread of its own until ``source`` ends, leaving
        out each whole line for which ``drop`` is true (a line that arrives in two pieces is
        kept whole)."""
        thread = threading.Thread(target=self._copy, args=(source, target, drop), daemon=True,
                                  name="hvdlikerun-output")
        thread.start()
        self._threads.append(thread)

    def _copy(self, source: BinaryIO, target: BinaryIO,
              drop: Optional[Callable[[bytes], bool]]) -> None:
        tail, line, writing = b"", b"", True
        fd = source.fileno()
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            shown = chunk if drop is None else b"".join(
                line for line in chunk.splitlines(keepends=True)
                if not (line.endswith(b"\n") and drop(line)))
            if writing and shown:
                try:
                    target.write(shown)
                    target.flush()
                except (OSError, ValueError):  # our output is gone: keep draining the job's
                    writing = False
            seen = tail + chunk
            if self.seen_at is None and any(n in seen for n in NOTICES):
                self.seen_at = time.monotonic()
            if self.done_at is None and _DONE in seen:
                self.done_at = time.monotonic()
            if self.ends_at is None and LAUNCHER_ENDS in seen:
                self.ends_at = time.monotonic()
            tail = seen[-_TAIL:]
            lines = line + chunk
            if _ENDED in lines:
                for found in _DEATH.finditer(lines, 0, lines.rfind(b"\n") + 1):
                    when = float(found.group(1)) if found.group(1) else float("inf")
                    said = _TIME.sub(b"", found.group(), count=1)  # the time only orders them
                    self._deaths.append((when, len(self._deaths),
                                         said.decode(errors="replace")))
            line = lines[lines.rfind(b"\n") + 1:][-_LINE:]
        source.close()

    @property
    def first_death(self) -> Optional[str]:
        """hvdlike's line naming the rank that died first (the earliest time of death; without
        times, the first line), or None."""
        return min(self._deaths)[2] if self._deaths else None

    def overdue(self, grace: float) -> bool:
        """A notice went by more than ``grace`` seconds ago."""
        return self.seen_at is not None and time.monotonic() - self.seen_at > grace

    def done_overdue(self, grace: float) -> bool:
        """An elastic job said every rank shut down more than ``grace`` seconds ago."""
        return self.done_at is not None and time.monotonic() - self.done_at > grace

    def ends_overdue(self, grace: float) -> bool:
        """The launcher said the job ends more than ``grace`` seconds ago."""
        return self.ends_at is not None and time.monotonic() - self.ends_at > grace

    def finish(self, timeout: float = 5.0) -> None:
        """Wait (a bounded time: orphaned processes may hold the pipes) for the copies."""
        for thread in self._threads:
            thread.join(timeout)
