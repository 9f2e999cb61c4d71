"""What the engine's execution works on: a ready response as this rank runs it (``Work``), the
result arrays kept for reuse and the reused fusion buffers."""
from typing import Any, Callable, List, NamedTuple, Optional, Tuple

import numpy as np

from . import fusion
from .buffers import ResultCache
from .checks import Kind, Request

pool = fusion.BufferPool()
results = ResultCache()
ALLREDUCES = (Kind.ALLREDUCE, Kind.GROUPED_ALLREDUCE)


class Work(NamedTuple):
    """One response as this rank runs it: its inputs (zeros on a rank that has joined) and
    where its result goes."""

    request: Request
    inputs: Any  # list of arrays, or the object / splits the collective needs
    process_set: Any
    done: Callable[[Any], None]  # receives the result
    # GPU work staged through host memory: the CUDA stream its inputs were copied on (and its
    # results go back on); None otherwise
    inputs_stream: Any = None
    # the handle ``done`` completes, which gets the error when running the work raises; None
    # where the result goes elsewhere (a joined rank's zeros, a latency-path call, GPU staging)
    handle: Any = None


Phases = Optional[List[Tuple[str, float, float]]]  # (name, start, end) for the timeline


Empty = Callable[[tuple, np.dtype], np.ndarray]


def row_bytes(a: np.ndarray) -> int:
    return a.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))


def zeros_for(request: Request) -> List[np.ndarray]:
    """What a rank that has joined contributes to an all-reduce: zeros of the agreed shape."""
    if request.kind == Kind.GROUPED_ALLREDUCE:
        return [np.zeros(s, d) for s, d in zip(request.shape, request.dtype)]
    return [np.zeros(request.shape, request.dtype)]
