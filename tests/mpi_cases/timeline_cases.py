"""Each rank writes its timeline; the cases return what their own file holds."""
import json
import time
from typing import Any, Dict, List

import numpy as np

import hvdlike as hvd
from hvdlike.engine.timeline import rank_file


def read_own(path: str) -> List[Dict[str, Any]]:
    """The events of this rank's timeline file for ``path``."""
    with open(rank_file(path, hvd.rank())) as f:
        return json.load(f)


def _rows(events: List[Dict[str, Any]]) -> Dict[str, List[str]]:
    """row name -> the names of its events, in time order."""
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    rows: Dict[str, List[Any]] = {}
    for e in sorted((e for e in events if e.get("ph") == "X"), key=lambda e: e["ts"]):
        rows.setdefault(names[e["tid"]], []).append(e)
    return rows


def phases(path: str, delay: float) -> Dict[str, Any]:
    """Under HVDLIKE_TIMELINE: a fused bucket of async all-reduces, a grouped all-reduce big
    enough for shared memory, an allgather, an Adasum all-reduce, and twice one all-reduce the
    last rank submits ``delay`` s late. Then ``stop_timeline``; the request after it must not
    appear."""
    rank, size = hvd.rank(), hvd.size()
    handles = [hvd.allreduce_async(np.ones(100 * (i + 1), np.float32), name=f"g{i}")
               for i in range(3)]
    for h in handles:
        h.synchronize()
    hvd.grouped_allreduce([np.ones(100_000, np.float32), np.ones(7, np.float32)], name="grp")
    hvd.allgather(np.ones((rank + 1, 2)), name="gather")
    hvd.allreduce(np.ones(5, np.float32), op=hvd.Adasum, name="ada")
    for _ in range(2):  # announced in full, then negotiated by its cache bit
        if rank == size - 1:
            time.sleep(delay)
        hvd.allreduce(np.ones(4), name="late")
    hvd.stop_timeline()
    hvd.allreduce(np.ones(4), name="after_stop")
    rows = _rows(read_own(path))
    return {name: [(e["name"], e["dur"], e.get("args", {})) for e in events]
            for name, events in rows.items()}


def start_and_stop(path: str) -> Dict[str, Any]:
    """``start_timeline`` records only while it runs; a bad path is refused."""
    hvd.allreduce(np.ones(4), name="before")
    hvd.start_timeline(path, mark_cycles=True)
    hvd.allreduce(np.ones(4), name="during")
    hvd.stop_timeline()
    hvd.allreduce(np.ones(4), name="after")
    events = read_own(path)
    try:
        hvd.start_timeline("")
        error = None
    except ValueError as e:
        error = str(e)
    return dict(rows=sorted(_rows(events)), cycles=sum(e["name"] == "CYCLE_START" for e in events),
                error=error)


def single_rank(path: str) -> Dict[str, Any]:
    """At np=1 under HVDLIKE_TIMELINE: a grouped all-reduce (Average, postscale 2) of three
    tensors of two dtypes; returns its results and the phases of its row."""
    xs = [np.arange(6, dtype=np.float32), np.arange(3, dtype=np.float16),
          np.ones((2, 2), np.float32)]
    out = hvd.grouped_allreduce(xs, name="single", postscale_factor=2.0)
    hvd.stop_timeline()
    return dict(out=[o.tolist() for o in out], dtypes=[str(o.dtype) for o in out],
                phases=[e["name"] for e in _rows(read_own(path))["single"]])


def while_running(path: str) -> Dict[str, Any]:
    """Under HVDLIKE_TIMELINE with cycle marks: this rank's file, read before the timeline is
    stopped, already holds a named all-reduce's phases (the array is not closed yet)."""
    hvd.allreduce(np.ones(3, np.float32), name="test_allreduce")
    own = rank_file(path, hvd.rank())
    with open(own) as f:
        text = f.read().rstrip()
    events = json.loads(text.rstrip(",") + "]")
    hvd.stop_timeline()
    return dict(file=own, closed=text.endswith("]"), rows=sorted(_rows(events)),
                names=sorted({e["name"] for e in events}))
