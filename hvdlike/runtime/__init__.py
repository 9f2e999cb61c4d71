"""The MPI world hvdlike runs in: init/shutdown, ranks, node topology; how a rank ends on
failure (``ending``), elastic shrinking (``shrink``), what this build can do
(``capabilities``).

Topology comes from MPI (``MPI_Comm_split_type(SHARED)``): ranks sharing memory form a node.
``HVDLIKE_NODE_NAMES=a,a,b,b`` (one name per world rank) overrides it so that tests can
simulate several nodes on one machine.
"""
import atexit
import dataclasses
import functools
import numbers
import os
import socket
import sys
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence

from . import ending, launched_world, recovery_deadline, session_dirs, sets
from .abort_notice import AbortNotice
from ..base import death_notice, files, log
from ..base.errors import NotInitializedError
from ..base.settings import Settings, with_horovod_names
from ..engine import timeline


@dataclasses.dataclass
class State:
    settings: Settings
    mpi: ModuleType  # mpi4py.MPI
    transport: ModuleType  # hvdlike.transport.mpi
    world: Any  # our duplicate of the user's communicator
    rank: int
    size: int
    local_comm: Any
    local_rank: int
    local_size: int
    cross_comm: Any
    cross_rank: int
    cross_size: int
    homogeneous: bool
    node_of_rank: List[int]  # per world rank: the world rank of its node's local rank 0
    host_of_node: Dict[int, str]  # that rank's host name, by node
    engine: Any = None  # engine.engine.Engine: all collective communication goes through it
    previous_excepthook: Optional[Any] = None
    abort_notice: Optional[AbortNotice] = None  # under ULFM (abort_notice.py)
    lost: int = 0  # ranks lost in elastic resets before this world (``shrink``)

    @functools.cached_property
    def nodes_in_blocks(self) -> bool:
        """Several nodes with the same number of ranks (at least 2) each, numbered node after
        node (as ``-H a:2,b:2`` and slot mapping give): what node-by-node collectives need."""
        n = self.local_size
        return (self.homogeneous and self.cross_size > 1 and n > 1
                and all(self.node_of_rank[r] == r - r % n for r in range(self.size)))


_state: Optional[State] = None
_atexit_registered: List[bool] = []


def state(what: str = "this call") -> State:
    """The running state, or NotInitializedError naming ``what`` was called too early."""
    if _state is None:
        raise NotInitializedError(
            f"hvdlike has not been initialized: call hvdlike.init() before {what}.")
    return _state


def init(comm: Any = None, abort_on_exception: Optional[bool] = None) -> None:
    """Start hvdlike on every rank. Idempotent.

    comm: an mpi4py communicator to run on (default ``MPI.COMM_WORLD``; it is duplicated so
    hvdlike's traffic never mixes with yours), or, as in Horovod, a list of ranks of
    ``MPI.COMM_WORLD`` to run on, in that order (every world rank calls ``init`` with the same
    list; a rank not in it gets ValueError). Without mpirun this is a world of size 1.
    abort_on_exception: if True (default, or HVDLIKE_ABORT_ON_EXCEPTION), an uncaught exception
    on any rank calls MPI_Abort so the other ranks stop instead of hanging.
    """
    global _state
    if _state is not None:
        return
    settings = Settings.from_env()
    from ..transport import mpi as transport  # initializes MPI

    MPI = transport.MPI
    joining = None  # a replacement's part of the elastic recovery has its deadline too
    if comm is None and MPI.Comm.Get_parent() != MPI.COMM_NULL:
        joining = recovery_deadline.RecoveryDeadline(
            "a rank started in place of the dead", recovery_deadline.seconds(os.environ))
    try:
        _start(settings, MPI, transport, comm, abort_on_exception)
    finally:
        if joining is not None:
            joining.done()


def _start(settings: Settings, MPI: ModuleType, transport: ModuleType, comm: Any,
           abort_on_exception: Optional[bool]) -> None:
    global _state
    launched_world.check(MPI, os.environ)
    joined = _join_parents(MPI) if comm is None else None
    if comm is None:
        comm = MPI.COMM_WORLD if joined is None else joined
    elif isinstance(comm, (list, tuple, range)):
        comm = joined = _comm_of_ranks(MPI, list(comm))
    world = comm.Dup()
    if joined is not None:
        joined.Free()
    made = [world]  # communicators to free if init fails half-way
    try:
        rank, size = world.Get_rank(), world.Get_size()
        log.setup(rank, settings.log_level)
        _check_same_settings(world, settings)
        if rank == 0:  # once per job
            for note in with_horovod_names(os.environ)[1]:
                log.logger.warning(note)
        local_comm = _split_local(MPI, world, settings.node_names)
        made.append(local_comm)
        local_rank, local_size = local_comm.Get_rank(), local_comm.Get_size()
        cross_comm = world.Split(color=local_rank, key=rank)
        made.append(cross_comm)
        placed = world.allgather((local_comm.bcast(rank, root=0),
                                  socket.gethostname() if local_rank == 0 else ""))
        node_of_rank = [node for node, _ in placed]
        if settings.timeline or settings.autotune_log:  # before the engine's thread runs
            _open_output_files_on_every_rank(MPI, world, settings)
    except BaseException:
        timeline.stop_timeline()
        for c in made:
            c.Free()
        raise
    if local_rank == 0:  # once per node: what killed launchers left would stop later jobs
        session_dirs.remove_stale_from_rank(os.environ)
    local_sizes = [node_of_rank.count(node) for node in set(node_of_rank)]
    _state = State(
        settings=settings, mpi=MPI, transport=transport, world=world, rank=rank, size=size,
        local_comm=local_comm, local_rank=local_rank, local_size=local_size,
        cross_comm=cross_comm, cross_rank=cross_comm.Get_rank(),
        cross_size=cross_comm.Get_size(), homogeneous=len(set(local_sizes)) == 1,
        node_of_rank=node_of_rank, host_of_node={node: host for node, host in placed if host},
    )
    sets.bind_global(size, world)
    if size > 1 and ending.ulfm():  # every rank alike, whatever its abort_on_exception
        # before the engine's thread starts its rounds: two threads of a rank in MPI at once
        # can hang Open MPI over TCP (a job across hosts hung here in 2 of 30 runs)
        _state.abort_notice = AbortNotice(MPI, world)
    from ..engine.engine import Engine
    _state.engine = Engine(_state, sets.REGISTERED, ending.finalize_with_deadline_at_exit,
                           lambda: ending.end_job(world))
    if not _atexit_registered:
        atexit.register(shutdown)
        _atexit_registered.append(True)
    abort = settings.abort_on_exception if abort_on_exception is None else abort_on_exception
    if abort and size > 1:
        ending.install_abort_hook(_state)
    death_notice.start(rank, size)  # from here on a death is named


_replacement: List[bool] = []


def is_replacement() -> bool:
    """True in a process that an elastic reset started in place of a dead rank
    (``hvdlikerun --max-np``)."""
    return bool(_replacement)


def _join_parents(MPI: ModuleType) -> Optional[Any]:
    """In a replacement that an elastic reset spawned (``MPI_Comm_spawn``): the world of the
    survivors and the replacements, merged with this process after them; else None."""
    parents = MPI.Comm.Get_parent()
    if parents == MPI.COMM_NULL:
        return None
    _replacement.append(True)
    merged = parents.Merge(high=True)
    parents.Free()  # Open MPI crashes in MPI_Finalize while a spawn's communicators live
    ending.finalize_with_deadline_at_exit()
    return merged


def _check_same_settings(world: Any, settings: Settings) -> None:
    """Ranks that read different HVDLIKE_* values would pick different fusion buckets or
    transports for the same call and hang: fail on every rank instead, naming the values."""
    everyone = [dataclasses.replace(s, log_level="") for s in world.allgather(settings)]
    if all(s == everyone[world.Get_rank()] for s in everyone):
        return
    differing = []
    for field in dataclasses.fields(Settings):
        values = [getattr(s, field.name) for s in everyone]
        if len(set(values)) > 1:
            by_rank = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
            differing.append(f"{field.name} ({by_rank})")
    raise ValueError("hvdlike.init: ranks read different HVDLIKE_* settings: "
                     + "; ".join(differing) + ". Set them the same on every rank (mpirun "
                     "and hvdlikerun forward the environment of the launching shell).")


def _open_output_files_on_every_rank(MPI: ModuleType, world: Any, settings: Settings) -> None:
    """Open the files ranks write from the start (``HVDLIKE_TIMELINE``'s on each rank,
    ``HVDLIKE_AUTOTUNE_LOG`` on rank 0); where one rank cannot (a folder it may not write, a
    link planted in a shared folder), every rank raises that rank's reason."""
    rank, size = world.Get_rank(), world.Get_size()
    reason = ""
    try:
        if settings.autotune and settings.autotune_log and rank == 0:
            what = "autotune log (HVDLIKE_AUTOTUNE_LOG)"
            files.open_for_writing(settings.autotune_log).close()
        if settings.timeline:
            what = "timeline (HVDLIKE_TIMELINE)"
            timeline.start(settings.timeline, rank, settings.timeline_mark_cycles)
    except OSError as exc:
        reason = f"its {what}: {exc}"
    first = world.allreduce(rank if reason else size, op=MPI.MIN)
    if first < size:
        raise OSError(f"hvdlike.init: rank {first} cannot write {world.bcast(reason, first)}")


def _split_local(MPI: ModuleType, world: Any, node_names: Optional[Sequence[str]]) -> Any:
    if node_names is None:
        return world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    if len(node_names) != world.Get_size():
        raise ValueError(
            f"HVDLIKE_NODE_NAMES lists {len(node_names)} node names but the job has "
            f"{world.Get_size()} ranks: give exactly one name per rank, e.g. 'a,a,b,b'")
    color = sorted(set(node_names)).index(node_names[world.Get_rank()])
    return world.Split(color=color, key=world.Get_rank())


def _on_node_layout(ranks: Sequence[int]) -> Optional[str]:
    """How a set of world ``ranks`` can reduce through memory: ``"node"`` (all on one node),
    ``"hierarchical"`` (the whole world on several nodes with the same number of ranks each,
    unless HVDLIKE_HIERARCHICAL_ALLREDUCE=0), or None (one rank, other sets spanning nodes,
    or HVDLIKE_SHM_BUFFER=0)."""
    st = state()
    if len(ranks) < 2 or st.settings.shm_buffer == 0:
        return None
    if len({st.node_of_rank[r] for r in ranks}) == 1:
        return "node"
    if (st.settings.hierarchical_allreduce != "0" and len(ranks) == st.size
            and st.homogeneous and st.local_size > 1):
        return "hierarchical"
    return None


def group_of(ranks: Sequence[int], comm: Any) -> Any:
    """The transports of a set of world ``ranks`` with communicator ``comm`` on this member
    (``transport.group.Group``): the on-node ones over ``comm`` when the set is on one node,
    over this node's ranks and then across nodes when it is hierarchical, none otherwise (see
    ``_on_node_layout``). Collective over the set."""
    st = state()
    from ..transport.group import Group
    layout = _on_node_layout(ranks)
    node = None if layout is None else (comm, None) if layout == "node" else (
        st.local_comm, st.cross_comm)
    return Group(comm, st.settings, node)


def _comm_of_ranks(MPI: Any, ranks: List[Any]) -> Any:
    """Horovod's ``init(comm=[ranks])``: a communicator of those ranks of ``MPI.COMM_WORLD``,
    ranked in the list's order. Collective over the world; ValueError on every rank when the
    ranks give different lists or a bad one, and on the ranks that are not in it."""
    world = MPI.COMM_WORLD
    me, size = world.Get_rank(), world.Get_size()
    ranks = [int(r) if isinstance(r, numbers.Integral) and not isinstance(r, bool) else r
             for r in ranks]  # NumPy integers too, as Horovod takes them
    lists = [repr(other) for other in world.allgather(ranks)]  # repr: True and 1 differ
    if any(other != lists[0] for other in lists):
        differ = [r for r, other in enumerate(lists) if other != lists[0]]
        raise ValueError(f"hvdlike.init(comm=[ranks]): the ranks passed different lists (rank 0: "
                         f"{lists[0]}, rank {differ[0]}: {lists[differ[0]]}); pass the same "
                         "list on every rank")
    if (not ranks or len(set(ranks)) != len(ranks)
            or not all(type(r) is int and 0 <= r < size for r in ranks)):
        raise ValueError(f"hvdlike.init(comm={ranks}): give distinct ranks of MPI_COMM_WORLD, "
                         f"whole numbers from 0 to {size - 1}")
    member = me in ranks
    sub = world.Split(0 if member else MPI.UNDEFINED, ranks.index(me) if member else 0)
    if not member:
        raise ValueError(f"hvdlike.init(comm={ranks}): rank {me} of MPI_COMM_WORLD is not in "
                         "the list: hvdlike runs on those ranks only (catch this error on the "
                         "others)")
    return sub


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing this rank's timeline: rank 0 to ``file_path``, rank r > 0 to
    ``file_path`` with ``.rank<r>`` added before the extension. A timeline already running is
    closed first. ``mark_cycles`` adds a ``CYCLE_START`` mark for every engine round that ran
    something."""
    timeline.start(file_path, state("hvdlike.start_timeline").rank, mark_cycles)


def shutdown() -> None:
    """Stop the engine and release hvdlike's communicators, together with the other ranks
    (collective; also run at exit): returns once every rank has called it. Requests still
    pending fail; meanwhile the other ranks' collectives that wait for this rank fail at once
    (RuntimeError) instead of hanging. ``init()`` may be called again after."""
    global _state
    st = _state
    if st is None:
        return
    death_notice.quiet()
    st.engine.stop()
    timeline.stop_timeline()
    sets.unbind_all(release=True)
    if st.abort_notice is not None:
        st.abort_notice.free()
    for comm in (st.cross_comm, st.local_comm, st.world):
        comm.Free()
    if st.previous_excepthook is not None:
        sys.excepthook = st.previous_excepthook
    _state = None
    if st.lost and st.rank == 0:
        # the launcher may still wait for lost ranks (a host it cannot reach, a frozen one);
        # hvdlikerun ends the job --abort-timeout after this line (runner/abort_watch.py)
        # printed whatever HVDLIKE_LOG_LEVEL says: hvdlikerun looks for it
        print(f"hvdlike[0]: {death_notice.ELASTIC_DONE} ({st.size} ranks; {st.lost} lost on "
              "the way)", file=sys.stderr, flush=True)


def is_initialized() -> bool:
    return _state is not None


def current() -> Optional[State]:
    """The running world's state, or None before ``init`` (and after ``shutdown``)."""
    return _state


def forget_world() -> None:
    """Forget the world and its process sets without freeing them (ranks died: freeing is
    collective over them); ``runtime.shrink`` then starts a new one."""
    global _state
    death_notice.quiet()
    sets.unbind_all(release=False)
    _state = None


def failure() -> Optional[Exception]:
    """The RanksFailedError of this world when ranks died under ULFM, else None."""
    return None if _state is None else _state.engine.failure


def ended_by() -> Optional[int]:
    """Under ULFM, after ranks died: the rank that ended the job on an uncaught exception
    (it said so before it left), or None when no rank did (they crashed or were killed)."""
    if _state is None or _state.abort_notice is None:
        return None
    return _state.abort_notice.sender()


def rank() -> int:
    """This process's rank in the world, 0..size()-1."""
    return state("hvdlike.rank()").rank


def size() -> int:
    """Number of ranks in the world."""
    return state("hvdlike.size()").size


def local_rank() -> int:
    """This process's rank among the ranks on its node."""
    return state("hvdlike.local_rank()").local_rank


def local_size() -> int:
    """Number of ranks on this process's node."""
    return state("hvdlike.local_size()").local_size


def cross_rank() -> int:
    """This node's index among the nodes (the rank in the communicator of equal local_rank)."""
    return state("hvdlike.cross_rank()").cross_rank


def cross_size() -> int:
    """Number of ranks with this process's local_rank, one per node (the node count)."""
    return state("hvdlike.cross_size()").cross_size


def is_homogeneous() -> bool:
    """True when every node runs the same number of ranks."""
    return state("hvdlike.is_homogeneous()").homogeneous


