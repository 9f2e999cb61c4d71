"""Process sets: collectives over a subset of the world's ranks.

Registering or removing a set is collective over the whole world: every rank calls
``add_process_set`` with the same ranks, members and non-members alike. Both run in the
engine, in its order of requests, like any other collective.
"""
from typing import Any, Dict, Iterable, List, Optional, Union

from . import runtime
from .checks import Request, raised_on_every_rank
from .errors import CollectiveMismatchError


class ProcessSet:
    """A set of world ranks. Pass it as ``process_set=`` to any collective once registered."""

    def __init__(self, ranks: Iterable[int]) -> None:
        self.ranks: List[int] = sorted(int(r) for r in ranks)
        if len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"process set ranks {self.ranks} contain duplicates")
        self.process_set_id: Optional[int] = None
        self._comm: Any = None  # the set's MPI communicator on members, None elsewhere
        self._rank = -1
        self._shm: Any = None  # on-node shared-memory all-reduce (members on one node only)
        self._cma: Any = None  # on-node single-copy all-reduce, where the kernel allows it

    def _bind(self, process_set_id: int, ranks: List[int], comm: Any) -> None:
        self.process_set_id, self.ranks, self._comm = process_set_id, ranks, comm
        self._rank = comm.Get_rank() if comm is not None else -1
        self._shm = runtime.shared_memory_reducer(ranks, comm) if comm is not None else None
        self._cma = runtime.single_copy_reducer(ranks, comm) if comm is not None else None
        _registry[process_set_id] = self

    def _unbind(self) -> None:
        _registry.pop(self.process_set_id, None)
        if self._shm is not None:
            self._shm.free()
        if self._comm is not None and self.process_set_id != 0:
            self._comm.Free()
        self.process_set_id, self._comm, self._rank, self._shm = None, None, -1, None
        self._cma = None

    def size(self) -> int:
        """Number of ranks in the set."""
        return len(self.ranks)

    def rank(self) -> int:
        """This process's rank within the set, or -1 when it is not a member."""
        return self._rank

    def included(self) -> bool:
        """True when this process is a member of the set."""
        return self._comm is not None

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet(())
"""All ranks of the world (id 0); bound by ``hvdlike.init()``."""

_registry: Dict[int, ProcessSet] = {}


def require_registered(process_set: ProcessSet, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` unless ``process_set`` is registered (not one
    never added, removed, or with an id set by hand)."""
    if process_set.process_set_id is None or \
            _registry.get(process_set.process_set_id) is not process_set:
        raise ValueError(f"{what}: {process_set} is not registered; call "
                         "hvdlike.add_process_set(...) on every rank first")


def add_process_set(process_set: Union[ProcessSet, Iterable[int]]) -> ProcessSet:
    """Register a process set. Collective: every world rank calls it with the same ranks.

    Returns the registered ProcessSet (the one passed, or a new one built from the ranks).
    """
    st = runtime.state("hvdlike.add_process_set()")
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    error = None
    if ps.process_set_id is not None:
        error = f"{ps} is already registered"
    elif not ps.ranks:
        error = "a process set needs at least one rank"
    elif ps.ranks[0] < 0 or ps.ranks[-1] >= st.size:
        error = f"process set ranks {ps.ranks} must lie in 0..{st.size - 1}"
    else:
        for other in _registry.values():
            if other.ranks == ps.ranks:
                error = f"a process set with ranks {ps.ranks} already exists: {other}"

    def register() -> ProcessSet:  # runs in the engine, in the same round on every rank
        answers = st.world.allgather((ps.ranks, error))
        errors = [f"rank {r}: {e}" for r, (_, e) in enumerate(answers) if e]
        if errors:
            raise raised_on_every_rank(
                ValueError("hvdlike.add_process_set failed: " + "; ".join(errors)), st.rank)
        if any(ranks != ps.ranks for ranks, _ in answers):
            listing = "; ".join(f"rank {r}: {ranks}" for r, (ranks, _) in enumerate(answers))
            raise raised_on_every_rank(CollectiveMismatchError(
                f"hvdlike.add_process_set: ranks passed different sets ({listing}); every rank "
                "must call add_process_set with the same ranks, in the same order of calls"),
                st.rank)
        member = st.rank in ps.ranks
        comm = st.world.Split(color=0 if member else st.mpi.UNDEFINED, key=st.rank)
        ps._bind(max(_registry) + 1, ps.ranks, comm if member else None)
        return ps

    return _in_engine(st, register)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set. Collective over the world. Returns False if it was not
    registered, or is the global set (which stays), as in Horovod."""
    st = runtime.state("hvdlike.remove_process_set()")
    if process_set.process_set_id == 0:
        return False

    def unregister() -> bool:  # runs in the engine, in the same round on every rank
        ids = st.world.allgather(process_set.process_set_id)
        if len(set(ids)) != 1:
            raise raised_on_every_rank(CollectiveMismatchError(
                f"hvdlike.remove_process_set: ranks passed different sets (ids by rank: {ids})"),
                st.rank)
        if process_set.process_set_id is None:
            return False
        st.engine.forget_set(process_set.process_set_id)
        process_set._unbind()
        return True

    return _in_engine(st, unregister)


def _in_engine(st: "runtime._State", change: Any) -> Any:
    request = Request("process_set", None, None, None)
    return st.engine.submit(request, None, change, global_process_set).synchronize()


def _release_all() -> None:
    for ps in list(_registry.values()):
        ps._unbind()


def _drop_all() -> None:
    """Forget every set without freeing its MPI objects (their world lost ranks: freeing is
    collective and cannot complete)."""
    for ps in list(_registry.values()):
        _registry.pop(ps.process_set_id, None)
        ps.process_set_id, ps._comm, ps._rank, ps._shm = None, None, -1, None
        ps._cma = None
