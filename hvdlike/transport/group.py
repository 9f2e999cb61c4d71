"""What one process set's members move data over: the set's MPI communicator and the on-node
transports its layout allows, and the choice among them for a bucket of host arrays.

Adding an on-node transport: a module with a class that implements
``interface.HostAllreduce`` and an ``interface.OnNodeTransport`` entry, its tests, and its
entry in ``ON_NODE`` below.
"""
from typing import Any, Dict, List, Optional, Tuple

from ..base.settings import Settings
from . import cma, shm
from .choice import AlgorithmChoice
from .interface import HostAllreduce, OnNodeTransport

ON_NODE: Tuple[OnNodeTransport, ...] = (shm.TRANSPORT, cma.TRANSPORT)

Trial = Tuple[AlgorithmChoice, bool]  # an ``auto`` choice still timing, and which one runs


class Group:
    """A process set as its members' transports see it. ``comm``: the set's MPI
    communicator. ``node``: None, or (the communicator of this node's members, the one across
    nodes or None) where the set may reduce through memory (see ``runtime``); then every
    transport of ``ON_NODE`` that can run is built, collectively, in ``ON_NODE``'s order."""

    def __init__(self, comm: Any, settings: Settings,
                 node: Optional[Tuple[Any, Any]] = None) -> None:
        self.comm = comm
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()
        self.settings = settings
        self.reducers: Dict[str, HostAllreduce] = {}
        self.choices: Dict[str, AlgorithmChoice] = {}  # per ``auto`` transport, made on use
        self._ladder: List[Tuple[OnNodeTransport, HostAllreduce]] = []
        if node is not None:
            for transport in ON_NODE:
                reducer = transport.build(node[0], node[1], settings)
                if reducer is not None:
                    self.reducers[transport.name] = reducer
                    self._ladder.append((transport, reducer))
        lowest = self._ladder[0][0].threshold(settings) if self._ladder else None
        self.mpi_below: float = float("inf") if lowest is None else lowest
        """Buckets of fewer bytes go through MPI, whatever their number of tensors."""

    def select(self, nbytes: int) -> Tuple[Optional[HostAllreduce], Optional[Trial]]:
        """What reduces a bucket of ``nbytes`` (the same on every member): an on-node
        reducer, or None for MPI; and, while an ``auto`` setting is still timing two, the
        choice and whether this bucket runs its second one, to be told the bucket's time."""
        top = -1
        for i, (transport, _) in enumerate(self._ladder):
            if nbytes < transport.threshold(self.settings):
                break
            top = i
        for i in range(top, -1, -1):
            transport, reducer = self._ladder[i]
            if not reducer.reserve(nbytes):
                continue  # no room: the one below
            if not transport.timed(self.settings, reducer.across is not None):
                return reducer, None
            choice = self._choice(transport)
            second = choice.second(nbytes)
            if second != transport.self_first:
                return reducer, (choice, second)
            below = self._ladder[i - 1][1] if i > 0 else None  # None: MPI
            if below is None or below.reserve(nbytes):
                return below, (choice, second)
            return reducer, None  # the one below has no room: this one, untimed
        return None, None

    def _choice(self, transport: OnNodeTransport) -> AlgorithmChoice:
        choice = self.choices.get(transport.name)
        if choice is None:
            choice = self.choices[transport.name] = AlgorithmChoice(self.comm,
                                                                    transport.choice_names)
        return choice

    def free(self, comm: bool = True) -> None:
        """Release the on-node transports and (``comm``) the communicator; collective."""
        for reducer in self.reducers.values():
            reducer.free()
        if comm:
            self.comm.Free()
