"""Process sets: collectives over a subset of the world's ranks.

Registering or removing a set is collective over the whole world: every rank calls
``add_process_set`` with the same ranks, members and non-members alike. Both run in the
engine, in its order of requests, like any other collective.
"""
import sys
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import runtime
from .base.errors import CollectiveMismatchError
from .engine.checks import Kind, Request, raised_on_every_rank
from .runtime import sets as _sets

if TYPE_CHECKING:
    from .transport.group import Group


def _is_mpi_comm(obj: Any) -> bool:
    mpi = sys.modules.get("mpi4py.MPI")  # a communicator means mpi4py is imported already
    return mpi is not None and isinstance(obj, mpi.Comm)


class ProcessSet:
    """A set of world ranks. Pass it as ``process_set=`` to any collective once registered.

    Built from a list of ranks, or, as in Horovod, from an mpi4py communicator (for
    ``hvdlike.init(process_sets=...)`` only): its members, as ranks of hvdlike's world, are
    known once ``init`` has registered it.
    """

    def __init__(self, ranks_or_comm: Union[Iterable[int], Any]) -> None:
        self.mpi_comm: Any = None
        if _is_mpi_comm(ranks_or_comm):
            self.mpi_comm = ranks_or_comm
            ranks_or_comm = ()
        try:
            self.ranks: List[int] = sorted(int(r) for r in ranks_or_comm)
        except TypeError:
            raise TypeError("ProcessSet takes a list of ranks or an mpi4py communicator, got "
                            f"{type(ranks_or_comm).__name__}") from None
        if len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"process set ranks {self.ranks} contain duplicates")
        self.process_set_id: Optional[int] = None
        # on members: the set's communicator and on-node transports; None elsewhere
        self.group: Optional["Group"] = None

    def bind(self, process_set_id: int, ranks: List[int], comm: Any) -> None:
        """Register as set ``process_set_id`` of ``ranks`` (``comm``: its communicator on
        members, None elsewhere). The runtime and the set registration call it, not users."""
        self.process_set_id, self.ranks = process_set_id, ranks
        self.group = runtime.group_of(ranks, comm) if comm is not None else None
        _registry[process_set_id] = self

    def unbind(self, release: bool = True) -> None:
        """Forget the set; ``release``: free its transports too (collective), and its
        communicator unless it is the world's. Called at shutdown and set removal."""
        if self.process_set_id is not None:
            _registry.pop(self.process_set_id, None)
        if self.group is not None and release:
            self.group.free(comm=self.process_set_id != 0)
        self.process_set_id, self.group = None, None

    def size(self) -> int:
        """Number of ranks in the set."""
        return len(self.ranks)

    def rank(self) -> int:
        """This process's rank within the set, or -1 when it is not a member."""
        return -1 if self.group is None else self.group.rank

    def included(self) -> bool:
        """True when this process is a member of the set."""
        return self.group is not None

    def __repr__(self) -> str:  # Horovod's form
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")


global_process_set = ProcessSet(())
"""All ranks of the world (id 0); bound by ``hvdlike.init()``."""
_sets.use_global(global_process_set)

_registry: Dict[int, ProcessSet] = _sets.REGISTERED  # type: ignore[assignment]
_free_ids = _sets.FREE_IDS


def registered() -> Dict[int, ProcessSet]:
    """The registered process sets by id (the global set's id is 0)."""
    return dict(_registry)


def require_process_set(process_set: Any, what: str) -> None:
    """Raise ``TypeError`` naming ``what`` unless ``process_set`` is a ProcessSet (a list of
    ranks is a common slip)."""
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"{what}: process_set= takes a ProcessSet (what "
                        "hvdlike.add_process_set(ranks) returns, or hvdlike.global_process_set),"
                        f" got {type(process_set).__name__}")


def require_registered(process_set: ProcessSet, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` unless ``process_set`` is registered (not one
    never added, removed, or with an id set by hand); ``TypeError`` for no ProcessSet."""
    require_process_set(process_set, what)
    if process_set.process_set_id is None or \
            _registry.get(process_set.process_set_id) is not process_set:
        twin = next((ps for ps in _registry.values()
                     if process_set.ranks and ps.ranks == process_set.ranks), None)
        if twin is not None:  # init(process_sets=...) registers one object per distinct set
            raise ValueError(f"{what}: {process_set} is not registered, but {twin} has the "
                             "same ranks: use that one")
        raise ValueError(f"{what}: {process_set} is not registered; call "
                         "hvdlike.add_process_set(...) on every rank first")


def require_member(process_set: ProcessSet, what: str, why: str) -> "runtime.State":
    """The running state, once this rank may use ``process_set``: NotInitializedError before
    ``init``, ValueError naming ``what`` for a set that is not registered or that this rank is
    not in (``why`` says what follows from that)."""
    st = runtime.state(what)
    if process_set.group is None:
        require_registered(process_set, what)
        raise ValueError(f"{what}: rank {st.rank} is not a member of {process_set}; {why}")
    return st


def _world_ranks(comm: Any, st: "runtime.State") -> Optional[List[int]]:
    """The members of an mpi4py communicator as ranks of hvdlike's world (None for
    ``MPI.COMM_NULL``: this rank is in no such set)."""
    if comm == st.mpi.COMM_NULL:
        return None
    group, world = comm.Get_group(), st.world.Get_group()
    try:
        ranks = group.Translate_ranks(list(range(group.Get_size())), world)
    finally:
        group.Free()
        world.Free()
    if any(r == st.mpi.UNDEFINED for r in ranks):
        raise ValueError(f"a process set's communicator (size {len(ranks)}) has ranks outside "
                         f"hvdlike's world (size {st.size})")
    return sorted(int(r) for r in ranks)


def _ranks_error(ranks: List[int], size: int) -> Optional[str]:
    if not ranks:
        return "a process set needs at least one rank"
    if ranks[0] < 0 or ranks[-1] >= size:
        return f"process set ranks {ranks} must lie in 0..{size - 1}"
    return None


def init(comm: Any = None, process_sets: Optional[Sequence[Union[ProcessSet, Iterable[int]]]] = None,
         abort_on_exception: Optional[bool] = None) -> None:
    """Start hvdlike on every rank. Idempotent.

    comm: an mpi4py communicator to run on (default ``MPI.COMM_WORLD``; it is duplicated so
    hvdlike's traffic never mixes with yours), or, as in Horovod, a list of ranks of
    ``MPI.COMM_WORLD`` to run on, in that order (every world rank calls ``init`` with the same
    list; a rank not in it gets ValueError). Without mpirun this is a world of size 1.
    process_sets: process sets to register now, as ProcessSet objects (of ranks, or of mpi4py
    communicators, which may differ between ranks, e.g. from ``Split``) or lists of ranks. The
    distinct sets among all ranks' lists get ids 1, 2, ... (see ``register_at_init``).
    abort_on_exception: if True (default, or HVDLIKE_ABORT_ON_EXCEPTION), an uncaught exception
    on any rank calls MPI_Abort so the other ranks stop instead of hanging.
    """
    if runtime.is_initialized():
        return
    runtime.init(comm, abort_on_exception)
    try:
        if process_sets:
            register_at_init(process_sets)
    except BaseException:  # the same error on every rank: leave nothing half-initialized
        runtime.shutdown()
        raise


def register_at_init(process_sets: Sequence[Union[ProcessSet, Iterable[int]]]) -> None:
    """``hvdlike.init(process_sets=...)``, as in Horovod: each rank's list may hold ranks or
    communicators (a split communicator is a different set on different ranks); the distinct
    sets among all ranks' lists are registered, position by position and rank by rank, with
    ids 1, 2, ... Each rank's first object for a set is the registered one; a later object with
    the same ranks, or with the world's (``global_process_set``), stays unregistered."""
    st = runtime.state("hvdlike.init(process_sets=...)")
    objects: List[ProcessSet] = []
    entries: List[Tuple[bool, Optional[List[int]]]] = []  # (from a communicator?, ranks)
    error = None
    try:  # an error here is reported on every rank, in the round below
        for given in process_sets:
            if given is global_process_set:  # registered already, with id 0
                continue
            ps = given if isinstance(given, ProcessSet) else ProcessSet(given)
            objects.append(ps)
            if ps.process_set_id is not None:
                raise ValueError(f"{ps} is already registered")
            ranks = ps.ranks if ps.mpi_comm is None else _world_ranks(ps.mpi_comm, st)
            error = None if ranks is None else _ranks_error(ranks, st.size)
            if error:
                break
            entries.append((ps.mpi_comm is not None, ranks))
    except (TypeError, ValueError) as exc:
        error = str(exc)

    def register() -> None:  # runs in the engine, in the same round on every rank
        answers = st.world.allgather((entries, error))
        errors = [f"rank {r}: {e}" for r, (_, e) in enumerate(answers) if e]
        if errors:
            raise raised_on_every_rank(ValueError(
                "hvdlike.init(process_sets=...) failed: " + "; ".join(errors)), st.rank)
        if len({len(e) for e, _ in answers}) != 1:
            counts = "; ".join(f"rank {r}: {len(e)}" for r, (e, _) in enumerate(answers))
            raise raised_on_every_rank(CollectiveMismatchError(
                f"hvdlike.init: ranks passed different numbers of process sets ({counts})"),
                st.rank)
        distinct: List[List[int]] = []
        for i in range(len(entries)):
            column = [e[i] for e, _ in answers]
            if not any(comm for comm, _ in column) and \
                    any(ranks != column[0][1] for _, ranks in column):
                listing = "; ".join(f"rank {r}: {ranks}" for r, (_, ranks) in enumerate(column))
                raise raised_on_every_rank(CollectiveMismatchError(
                    f"hvdlike.init: process set {i} differs between ranks ({listing}); a list "
                    "of ranks must be the same on every rank (a communicator may differ)"),
                    st.rank)
            for _, ranks in column:
                if ranks is not None and ranks not in distinct:
                    distinct.append(ranks)
        for ranks in distinct:
            if any(ps.ranks == ranks for ps in _registry.values()):
                continue
            ps = next((p for p, (_, r) in zip(objects, entries) if r == ranks), None)
            if ps is None:  # a set only other ranks named (another part of a split)
                ps = ProcessSet(ranks)
            _bind_next(st, ps, ranks)
        for ps, (from_comm, ranks) in zip(objects, entries):
            if from_comm and ranks is not None and ps.process_set_id is None:
                ps.ranks = ranks  # a twin of a registered set: its members, for the error

    _in_engine(st, register)


def comm_process_set_id(comm: Any) -> int:
    """The id of the registered process set whose members are those of the mpi4py
    communicator ``comm`` (0 for one spanning the world), as Horovod's."""
    st = runtime.state("hvdlike.comm_process_set_id()")
    ranks = _world_ranks(comm, st)
    if ranks is None:
        raise ValueError("hvdlike.comm_process_set_id: got MPI.COMM_NULL (this rank is not in "
                         "that communicator), which stands for no process set")
    for set_id, ps in sorted(_registry.items()):
        if ps.ranks == ranks:
            return set_id
    raise ValueError(f"hvdlike.comm_process_set_id: no registered process set has the ranks "
                     f"{ranks} of this communicator; pass ProcessSet(comm) to hvdlike.init or "
                     "add_process_set(ranks) first")


def get_process_set_ids_and_ranks() -> Dict[int, List[int]]:
    """``{process set id: its world ranks}`` for every registered set, as Horovod's."""
    runtime.state("hvdlike.get_process_set_ids_and_ranks()")
    return {set_id: list(ps.ranks) for set_id, ps in sorted(_registry.items())}


def add_process_set(process_set: Union[ProcessSet, Iterable[int]]) -> ProcessSet:
    """Register a process set. Collective: every world rank calls it with the same ranks.

    Returns the registered ProcessSet (the one passed, or a new one built from the ranks).
    """
    st = runtime.state("hvdlike.add_process_set()")
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.mpi_comm is not None:
        raise NotImplementedError(
            "hvdlike.add_process_set: a process set built from an MPI communicator can only be "
            "registered by hvdlike.init(process_sets=[...]), as in Horovod; build this one from "
            "a list of ranks")
    error = None
    if ps.process_set_id is not None:
        error = f"{ps} is already registered"
    elif _ranks_error(ps.ranks, st.size):
        error = _ranks_error(ps.ranks, st.size)
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
        _bind_next(st, ps, ps.ranks)
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
        _free_ids.append(process_set.process_set_id)
        process_set.unbind()
        return True

    return _in_engine(st, unregister)


def _bind_next(st: "runtime.State", ps: ProcessSet, ranks: List[int]) -> None:
    """Register ``ps`` as the set of ``ranks`` with its communicator and the next id: a
    removed set's, or one past the highest (in the engine, on every rank alike)."""
    member = st.rank in ranks
    comm = st.world.Split(color=0 if member else st.mpi.UNDEFINED, key=st.rank)
    set_id = _free_ids.pop(0) if _free_ids else max(_registry) + 1
    ps.bind(set_id, ranks, comm if member else None)


def _in_engine(st: "runtime.State", change: Any) -> Any:
    request = Request(Kind.PROCESS_SET, None, None, None)
    return st.engine.submit(request, None, change, global_process_set).synchronize()
