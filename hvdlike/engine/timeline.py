"""The timeline: a Chrome-trace / Perfetto JSON file of what the engine did with each request.

``HVDLIKE_TIMELINE=path`` (read by ``hvd.init()``) or ``hvd.start_timeline(path)`` starts it,
``hvd.stop_timeline()`` or shutdown ends it. Each rank writes its own file: rank 0 writes
``path`` itself (where Horovod's one file is), rank r > 0 writes ``path`` with ``.rank<r>``
before the extension (``timeline.json`` -> ``timeline.rank1.json``, ...); see
``rank_file``. No traffic between ranks, and a rank that dies leaves what it had written.
Events are written out after every engine round that made some, so the file can be read while
training runs (a JSON array that is closed on stop). In the file, each request name is a row
with its phases:

- ``QUEUED``: submitted, until the first round that carried it;
- ``NEGOTIATE_<OP>`` (``NEGOTIATE_ALLREDUCE``, ``NEGOTIATE_ALLGATHER``, ...): that round (the
  exchange that tells every rank what the others have);
- ``WAIT_FOR_RANKS``: until the round in which every rank of its set had submitted it; its
  ``args`` name the ``last_ranks``, whose requests came in that round;
- then the phases of the bucket it ran in, named after what they do (``MEMCPY_IN_FUSION_BUFFER``,
  ``SHM_ALLREDUCE`` (the shared-memory window), ``CMA_ALLREDUCE`` (single-copy) or
  ``MPI_ALLREDUCE``, ``MEMCPY_OUT_FUSION_BUFFER``, ``MPI_ALLGATHER``, ...),
  with the bucket's number, size and members in ``args``.

A ``steps`` row holds ``STEP`` spans when TensorFlow drives training (see
``hvdlike.tensorflow``): each ends when an optimizer update has run. With ``mark_cycles``, the
``engine`` row has a ``CYCLE_START`` mark for every round that ran something.
``hvdlike-timeline`` (``runner/timeline_summary.py``) turns the files into a table and a PNG. Off by default; when
off, the engine pays one attribute test per round.
"""
import json
import os
import threading
import time
from typing import Any, Dict, List, Optional

from ..base import files

_FLUSH_EVERY = 4096  # events buffered before they are written


class Timeline:
    """One rank's timeline file. Times are ``time.perf_counter()`` values; the file holds
    wall-clock microseconds, so files of ranks on one host line up."""

    def __init__(self, path: str, rank: int, mark_cycles: bool = False) -> None:
        self.path = rank_file(path, rank)
        self.mark_cycles = mark_cycles
        self._rank = rank
        self.last_step_end = time.perf_counter()
        self._offset_us = (time.time() - time.perf_counter()) * 1e6
        self._rows: Dict[str, int] = {}
        self._events: List[str] = []
        self._lock = threading.Lock()
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._file = files.open_for_writing(self.path)  # never through a planted link
        self._file.write("[\n")
        self._add({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                   "args": {"name": f"rank {rank}"}})

    def _us(self, t: float) -> float:
        return round(t * 1e6 + self._offset_us, 1)

    def _row(self, name: str) -> int:
        tid = self._rows.get(name)
        if tid is None:
            tid = self._rows[name] = len(self._rows) + 1
            self._add({"name": "thread_name", "ph": "M", "pid": self._rank, "tid": tid,
                       "args": {"name": name}})
            self._add({"name": "thread_sort_index", "ph": "M", "pid": self._rank, "tid": tid,
                       "args": {"sort_index": tid}})
        return tid

    def _add(self, event: Dict[str, Any]) -> None:
        self._events.append(json.dumps(event, separators=(",", ":")))
        if len(self._events) >= _FLUSH_EVERY:
            self._flush()

    def _flush(self) -> None:
        if self._events:
            self._file.write(",\n".join(self._events) + ",\n")
            self._events = []

    def span(self, row: str, name: str, start: float, end: float,
             args: Optional[Dict[str, Any]] = None) -> None:
        """A phase ``name`` on ``row`` from ``start`` to ``end`` (perf_counter seconds)."""
        event = {"name": name, "ph": "X", "pid": self._rank, "ts": self._us(start),
                 "dur": round(max(end - start, 0.0) * 1e6, 1)}
        if args:
            event["args"] = args
        with self._lock:
            event["tid"] = self._row(row)
            self._add(event)

    def instant(self, row: str, name: str, at: float) -> None:
        with self._lock:
            self._add({"name": name, "ph": "i", "s": "t", "pid": self._rank,
                       "tid": self._row(row), "ts": self._us(at)})

    def flush(self) -> None:
        """Write the buffered events out (the engine calls this after each round)."""
        with self._lock:
            if self._events:
                self._flush()
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._flush()
            self._file.write(json.dumps({"name": "timeline_end", "ph": "i", "s": "g",
                                         "pid": self._rank, "tid": 0,
                                         "ts": self._us(time.perf_counter())}) + "\n]\n")
            self._file.close()


current: Optional[Timeline] = None  # the engine reads this once per round


def rank_file(path: str, rank: int) -> str:
    """The file that ``rank`` writes for the timeline ``path``: ``path`` itself on rank 0,
    ``.rank<r>`` before the extension on the others."""
    if rank == 0:
        return str(path)
    root, ext = os.path.splitext(str(path))
    return f"{root}.rank{rank}{ext}"


def start(file_path: str, rank: int, mark_cycles: bool = False) -> None:
    """Start writing this rank's timeline (``hvdlike.start_timeline``, which the runtime
    defines: it knows the rank)."""
    global current
    if not isinstance(file_path, (str, os.PathLike)) or not str(file_path):
        raise ValueError(f"hvdlike.start_timeline: file_path must be a non-empty path, "
                         f"got {file_path!r}")
    stop_timeline()
    current = Timeline(str(file_path), rank, mark_cycles)


def stop_timeline() -> None:
    """Stop the timeline and close its file (nothing happens when none runs)."""
    global current
    timeline, current = current, None
    if timeline is not None:
        timeline.close()


def step_done() -> None:
    """A training step ended now (the TensorFlow layer calls this after each optimizer
    update): a ``STEP`` span from the previous one's end (or the timeline's start)."""
    timeline = current
    if timeline is not None:
        now = time.perf_counter()
        timeline.span("steps", "STEP", timeline.last_step_end, now)
        timeline.last_step_end = now
