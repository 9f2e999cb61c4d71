"""What the engine asks of the transports: of an on-node one (and how one is registered), and
of the rounds' control collectives.

MPI moves every collective on any buffers; an on-node transport all-reduces host arrays faster
where a process set's members share a node (or, hierarchically, node by node). Each one is a
class that has the methods of ``HostAllreduce`` and one ``OnNodeTransport`` entry
in ``transport.group.ON_NODE``, which says how to build it and from how many bytes a bucket
may use it; ``transport.group.Group.select`` picks among them by bytes and topology.
"""
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Protocol, Sequence

import numpy as np

from ..base.reduce_ops import ReduceOp
from ..base.settings import Settings

InPlacePass = Callable[[np.ndarray], None]


class HostAllreduce(Protocol):
    """A blocking all-reduce of host arrays over one process set's members. Every member
    calls each method together, as with any collective."""

    across: Any  # the communicator across nodes when it reduces node by node, else None

    @property
    def activity(self) -> str:
        """Its name on the timeline (``SHM_ALLREDUCE``, ``HIERARCHICAL_ALLREDUCE``, ...)."""

    def reserve(self, nbytes: int) -> bool:
        """Get ready to reduce ``nbytes`` at once; the same answer on every member (False:
        it cannot, use another transport)."""

    def allreduce_many(self, sends: Sequence[np.ndarray], recvs: Sequence[np.ndarray],
                       op: ReduceOp, finish: Optional[InPlacePass] = None) -> None:
        """Reduce the arrays as if they were one concatenated array, from ``sends`` into
        ``recvs`` (C-contiguous, one dtype, pairwise the same size, possibly the same array);
        ``finish`` is applied in place to each reduced piece (Average's scaling)."""

    def free(self) -> None:
        """Release what it holds (collective)."""


@dataclass(frozen=True)
class OnNodeTransport:
    """An on-node transport as the selector sees it. ``ON_NODE`` lists them from the one
    tried first (the lowest threshold) up: a bucket goes to the highest one whose threshold
    it reaches, all those below it reaching theirs too, and that has room for it."""

    name: str  # its key in ``Group.reducers`` and ``Group.choices``
    # (communicator of the node's members, the one across nodes or None, settings) -> the
    # reducer, or None where it cannot run; collective over the communicators
    build: Callable[[Any, Any, Settings], Optional[HostAllreduce]]
    threshold: Callable[[Settings], int]  # buckets from this many bytes may use it
    # (settings, node by node?) -> whether a setting says ``auto``: time it against the
    # transport below it (MPI for the lowest) on the job's own buckets, keep the faster
    timed: Callable[[Settings, bool], bool]
    # the two in the choice's log, the one tried first first (see ``choice.py``)
    choice_names: tuple = ("", "")
    self_first: bool = False  # the trials start with this transport, not the one below


class RoundNet(Protocol):
    """The collectives an engine round uses beyond its all-reduce, on every rank alike
    (``control.Control`` implements them over the engine's own communicator)."""

    def band(self, vector: np.ndarray) -> np.ndarray: ...
    def min(self, value: int) -> int: ...
    def bcast(self, obj: object, root: int) -> object: ...
    def allgather(self, obj: object) -> List[object]: ...
    def allgather_rows(self, row: np.ndarray) -> np.ndarray: ...
