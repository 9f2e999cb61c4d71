"""The MPI world hvdlike runs in: init/shutdown, ranks, node topology, abort on failure.

Topology comes from MPI (``MPI_Comm_split_type(SHARED)``): ranks sharing memory form a node.
``HVDLIKE_NODE_NAMES=a,a,b,b`` (one name per world rank) overrides it so that tests can
simulate several nodes on one machine.
"""
import atexit
import dataclasses
import functools
import importlib.util
import numbers
import os
import sys
import time
from types import ModuleType
from typing import Any, List, Optional, Sequence

from . import process_sets as _ps
from . import session_dirs
from .abort_notice import AbortNotice
from .base import log
from .base.errors import NotInitializedError
from .base.settings import Settings, with_horovod_names
from .engine import timeline

_QUIET_ABORT_DELAY = 3.0  # seconds


@dataclasses.dataclass
class _State:
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
    engine: Any = None  # engine.engine.Engine: all collective communication goes through it
    previous_excepthook: Optional[Any] = None
    abort_notice: Optional[AbortNotice] = None  # under ULFM (abort_notice.py)

    @functools.cached_property
    def nodes_in_blocks(self) -> bool:
        """Several nodes with the same number of ranks (at least 2) each, numbered node after
        node (as ``-H a:2,b:2`` and slot mapping give): what node-by-node collectives need."""
        n = self.local_size
        return (self.homogeneous and self.cross_size > 1 and n > 1
                and all(self.node_of_rank[r] == r - r % n for r in range(self.size)))


_state: Optional[_State] = None
_atexit_registered: List[bool] = []


def state(what: str = "this call") -> _State:
    """The running state, or NotInitializedError naming ``what`` was called too early."""
    if _state is None:
        raise NotInitializedError(
            f"hvdlike has not been initialized: call hvdlike.init() before {what}.")
    return _state


def init(comm: Any = None, process_sets: Optional[Sequence["_ps.ProcessSet"]] = None,
         abort_on_exception: Optional[bool] = None) -> None:
    """Start hvdlike on every rank. Idempotent.

    comm: an mpi4py communicator to run on (default ``MPI.COMM_WORLD``; it is duplicated so
    hvdlike's traffic never mixes with yours), or, as in Horovod, a list of ranks of
    ``MPI.COMM_WORLD`` to run on, in that order (every world rank calls ``init`` with the same
    list; a rank not in it gets ValueError). Without mpirun this is a world of size 1.
    process_sets: process sets to register now, as ProcessSet objects (of ranks, or of mpi4py
    communicators, which may differ between ranks, e.g. from ``Split``) or lists of ranks. The
    distinct sets among all ranks' lists get ids 1, 2, ... (see
    ``process_sets.register_at_init``).
    abort_on_exception: if True (default, or HVDLIKE_ABORT_ON_EXCEPTION), an uncaught exception
    on any rank calls MPI_Abort so the other ranks stop instead of hanging.
    """
    global _state
    if _state is not None:
        return
    settings = Settings.from_env()
    from .transport import mpi as transport  # initializes MPI

    MPI = transport.MPI
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
        node_of_rank = world.allgather(local_comm.bcast(rank, root=0))
    except BaseException:
        for c in made:
            c.Free()
        raise
    if local_rank == 0:  # once per node: what killed launchers left would stop later jobs
        session_dirs.remove_stale_from_rank(os.environ)
    local_sizes = [node_of_rank.count(node) for node in set(node_of_rank)]
    _state = _State(
        settings=settings, mpi=MPI, transport=transport, world=world, rank=rank, size=size,
        local_comm=local_comm, local_rank=local_rank, local_size=local_size,
        cross_comm=cross_comm, cross_rank=cross_comm.Get_rank(),
        cross_size=cross_comm.Get_size(), homogeneous=len(set(local_sizes)) == 1,
        node_of_rank=node_of_rank,
    )
    _ps.global_process_set._bind(0, list(range(size)), world)
    from .engine.engine import Engine
    _state.engine = Engine(_state, _ps._registry, finalize_with_deadline_at_exit)
    if settings.timeline:
        start_timeline(settings.timeline, settings.timeline_mark_cycles)
    if not _atexit_registered:
        atexit.register(shutdown)
        _atexit_registered.append(True)
    if size > 1 and _ulfm():  # every rank alike, whatever its abort_on_exception
        _state.abort_notice = AbortNotice(MPI, world)
    abort = settings.abort_on_exception if abort_on_exception is None else abort_on_exception
    if abort and size > 1:
        _install_abort_hook(_state)
    try:
        if process_sets:
            _ps.register_at_init(process_sets)
    except BaseException:  # the same error on every rank: leave nothing half-initialized
        shutdown()
        raise


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
    finalize_with_deadline_at_exit()
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
    from .transport.group import Group
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


def _install_abort_hook(st: _State) -> None:
    previous = sys.excepthook
    # after an elastic reset MPI_COMM_WORLD holds dead ranks (a replacement: only itself)
    world = st.world if _finalize_registered else st.mpi.COMM_WORLD

    def abort_job(etype: Any, value: Any, tb: Any) -> None:
        if getattr(value, "hvdlike_quiet", False):
            # Raised on every rank of a collective; the set's first rank prints it and aborts.
            # Abort here too after a grace period, in case that rank is not going to.
            time.sleep(_QUIET_ABORT_DELAY)
            _abort(world, st.rank)
        previous(etype, value, tb)
        sys.stderr.write(
            f"hvdlike: rank {st.rank} of {st.size} raised an uncaught {etype.__name__}; "
            "ending the whole job (MPI_Abort) so the other ranks do not hang "
            "(opt out: hvdlike.init(abort_on_exception=False) or HVDLIKE_ABORT_ON_EXCEPTION=0)\n")
        sys.stderr.flush()
        sys.stdout.flush()
        if st.abort_notice is not None:  # ULFM: so that elastic.run does not recover from it
            st.abort_notice.send()
        if st.engine is not None and st.engine.failure is not None:
            # Ranks died under ULFM: Open MPI 5's prterun deadlocked now and then when the
            # survivors called MPI_Abort, so exit instead; the first exit ends the job. A rank
            # that could not learn which ranks died (engine.failures.failed_ranks) waits a moment, so
            # that one that could is heard first.
            if not st.engine.failure.failed:
                time.sleep(1.0)
            os._exit(1)
        _abort(world, st.rank)

    st.previous_excepthook = previous
    sys.excepthook = abort_job


def _abort(world: Any, rank: int) -> None:
    """MPI_Abort, with a way out if it does not return. Under ULFM (``--with-ft ulfm``) Open
    MPI 5's prterun deadlocked about half the time when two ranks called MPI_Abort in the same
    millisecond (every rank raising the same error), with every rank gone; 10 ms apart it never
    did in our runs. So there the ranks abort in rank order, 20 ms apart (at most 1.3 s late):
    the first abort ends the job before the next one starts."""
    if _ulfm():
        time.sleep(0.02 * min(rank, 64))
    _exit_soon()
    world.Abort(1)


_finalize_registered: List[bool] = []


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing this rank's timeline: rank 0 to ``file_path``, rank r > 0 to
    ``file_path`` with ``.rank<r>`` added before the extension. A timeline already running is
    closed first. ``mark_cycles`` adds a ``CYCLE_START`` mark for every engine round that ran
    something."""
    timeline.start(file_path, state("hvdlike.start_timeline").rank, mark_cycles)


def finalize_with_deadline_at_exit() -> None:
    """Once ranks have died under ULFM: at exit, shut down and finalize MPI with a deadline
    (``_finalize_with_deadline``), whether or not an elastic reset follows. A script that
    catches the error itself and returns otherwise ended in mpi4py's MPI_Finalize, which
    now and then never returned (1 job in about 16 here)."""
    if not _finalize_registered:
        atexit.register(_finalize_with_deadline)
        _finalize_registered.append(True)


def _finalize_with_deadline(seconds: float = 10.0) -> None:
    """At exit of a rank that saw ranks die (or was started in place of one): shut hvdlike
    down, then MPI_Finalize, leaving after ``seconds`` if it has not returned. Open MPI 5's
    finalize waits on a fence with every process of the job, and after a death it now and
    then never returns; the status is then 1 if an uncaught exception ended the program,
    else 0. The deadline covers hvdlike's shutdown too (it frees communicators of the
    world)."""
    sys.stdout.flush()
    sys.stderr.flush()
    status = 1 if hasattr(sys, "last_type") else 0
    _exit_soon(seconds, status, "MPI_Finalize after ranks died")
    shutdown()
    from mpi4py import MPI
    if not MPI.Is_finalized():
        _finalize_without_gil(MPI)


def _finalize_without_gil(mpi: Any) -> None:
    """MPI_Finalize through ctypes, which lets go of the GIL while it runs: mpi4py's Finalize
    keeps it, and the deadline's timer thread could then never run."""
    import ctypes
    try:
        with open("/proc/self/maps") as maps:  # Linux: where the MPI library was loaded from
            paths = [line.split()[-1] for line in maps if "/libmpi.so" in line]
    except OSError:
        paths = []
    if not paths:
        mpi.Finalize()
        return
    ctypes.CDLL(paths[0]).MPI_Finalize()


def _exit_soon(seconds: float = 3.0, status: int = 1, what: str = "MPI_Abort") -> None:
    """Exit with ``status`` after ``seconds`` in case MPI does not end or return (MPI_Abort
    or MPI_Finalize under ULFM once ranks have died), saying so on stderr."""
    import threading

    def leave() -> None:
        os.write(2, f"hvdlike: {what} had not returned after {seconds:g} s; this rank exits "
                    f"with status {status}\n".encode())
        os._exit(status)

    timer = threading.Timer(seconds, leave)
    timer.daemon = True
    timer.start()


def shutdown() -> None:
    """Stop the engine and release hvdlike's communicators, together with the other ranks
    (collective; also run at exit): returns once every rank has called it. Requests still
    pending fail; meanwhile the other ranks' collectives that wait for this rank fail at once
    (RuntimeError) instead of hanging. ``init()`` may be called again after."""
    global _state
    st = _state
    if st is None:
        return
    st.engine.stop()
    timeline.stop_timeline()
    _ps._release_all()
    if st.abort_notice is not None:
        st.abort_notice.free()
    for comm in (st.cross_comm, st.local_comm, st.world):
        comm.Free()
    if st.previous_excepthook is not None:
        sys.excepthook = st.previous_excepthook
    _state = None


def is_initialized() -> bool:
    return _state is not None


def failure() -> Optional[Exception]:
    """The RanksFailedError of this world when ranks died under ULFM, else None."""
    return None if _state is None else _state.engine.failure


def ended_by() -> Optional[int]:
    """Under ULFM, after ranks died: the rank that ended the job on an uncaught exception
    (it said so before it left), or None when no rank did (they crashed or were killed)."""
    if _state is None or _state.abort_notice is None:
        return None
    return _state.abort_notice.sender()


def _ulfm() -> bool:
    """Whether the job runs with ULFM (``--with-ft ulfm``: a dead rank does not end it)."""
    return os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "true", "yes")


def shrink_after_failure(min_size: int = 1, max_size: int = 0) -> List[int]:
    """After ranks died (``failure()`` is set): build a new world of the survivors and start
    hvdlike on it. Collective over the survivors. Returns the old world ranks that died.

    With ``max_size``, new processes (the same command line, ``MPI_Comm_spawn``) replace the
    dead up to ``min(max_size, old size)`` ranks; they join after the survivors. When MPI
    cannot start them (no free slots) the survivors go on alone. The old world's
    communicators are revoked; nothing is freed together on them (a dead rank cannot take
    part). Process sets other than the global one are dropped: register them again, with the
    new ranks, in a reset callback. Raises RuntimeError on every rank when fewer than
    ``min_size`` ranks are left.
    """
    global _state
    st = state("hvdlike.elastic reset")
    error = st.engine.failure
    if error is None:
        raise RuntimeError("hvdlike: no ranks have failed; there is nothing to recover from")
    log.logger.debug("elastic: stopping the failed engine")
    st.engine.stop()
    timeline.stop_timeline()
    log.logger.debug("elastic: shrinking the world")
    survivors = st.world.Shrink()
    log.logger.debug(f"elastic: shrunk to {survivors.Get_size()} ranks")
    _ps._drop_all()
    if st.previous_excepthook is not None:
        sys.excepthook = st.previous_excepthook
    old_rank, old_size = st.rank, st.size
    _state = None
    finalize_with_deadline_at_exit()
    kept = survivors.allgather(old_rank)
    failed = sorted(set(range(old_size)) - set(kept))
    error.failed[:] = failed
    world = survivors
    wanted = min(max_size, old_size) - len(kept)
    if wanted > 0 and len(kept) + wanted >= min_size:  # else the job ends below: start none
        world = _spawn_replacements(st.mpi, survivors, wanted)
    try:
        init(comm=world)
    finally:
        if world is not survivors:
            world.Free()
        survivors.Free()
    new = state()
    if new.rank == 0:
        k = len(kept)
        joined = {0: "", 1: f", and a new rank joined as rank {k}"}.get(
            new.size - k, f", and {new.size - k} new ranks joined as ranks {k}..{new.size - 1}")
        log.logger.warning(f"elastic: ranks {failed} of {old_size} died; {k} ranks go on, "
                           f"renumbered 0..{k - 1} in their old order{joined}")
    log.logger.info(f"elastic: this rank was {old_rank} and is now {new.rank}")
    if new.size < min_size:
        too_few = RuntimeError(
            f"hvdlike.elastic: only {new.size} ranks are left after ranks {failed} died, "
            f"fewer than the minimum of {min_size} (hvdlikerun --min-np); the job ends")
        # rank 0 says it
        too_few.hvdlike_quiet = new.rank != 0  # type: ignore[attr-defined]
        raise too_few
    return failed


def _spawn_replacements(MPI: ModuleType, survivors: Any, count: int) -> Any:
    """Start ``count`` processes running this program (collective over the survivors); the
    world of survivors and new processes, or ``survivors`` when MPI could not start them."""
    info = MPI.Info.Create()
    info.Set("wdir", os.getcwd())
    try:
        # the interpreter's own arguments (``-m module``, ``-u``) where Python keeps them (3.10+)
        args = getattr(sys, "orig_argv", [sys.executable, *sys.argv])[1:]
        spawned = survivors.Spawn(sys.executable, args, maxprocs=count, root=0, info=info)
    except MPI.Exception as exc:
        if survivors.Get_rank() == 0:
            what = "a new rank" if count == 1 else f"{count} new ranks"
            log.logger.warning(
                f"elastic: could not start {what} in place of the dead ({exc}); going on with "
                "the survivors. MPI needs free slots for them: give the job more slots than "
                "-np (e.g. -H host:N, a hostfile, a larger allocation) or --oversubscribe")
        return survivors
    finally:
        info.Free()
    merged = spawned.Merge(high=False)
    spawned.Free()  # Open MPI crashes in MPI_Finalize while a spawn's communicators live
    return merged


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


def mpi_threads_supported() -> bool:
    """True when MPI runs with MPI_THREAD_MULTIPLE."""
    st = state("hvdlike.mpi_threads_supported()")
    return st.mpi.Query_thread() == st.mpi.THREAD_MULTIPLE


def mpi_enabled() -> bool:
    """True once hvdlike runs on MPI (always, after init)."""
    return _state is not None


def mpi_built() -> bool:
    """True when mpi4py is installed."""
    return importlib.util.find_spec("mpi4py") is not None


def nccl_built() -> bool:
    """True when CuPy and its NCCL library load, so GPU arrays can travel through NCCL."""
    from .transport import gpu

    return gpu.nccl_available()


def cuda_built() -> bool:
    """True when CuPy loads and sees a GPU (GPU arrays can be passed to collectives)."""
    from .transport import gpu

    return gpu.cuda_available()


def gpu_available(ext_base_name: str = "tensorflow", verbose: bool = False) -> bool:
    """Horovod's ``gpu_available``: whether GPU arrays can be reduced here (``cuda_built``);
    ``ext_base_name`` and ``verbose`` are accepted for Horovod's signature."""
    return cuda_built()


def ccl_built() -> bool:
    """Always False: hvdlike has no oneCCL path."""
    return False


def ddl_built() -> bool:
    """Always False: hvdlike has no IBM DDL path."""
    return False


def rocm_built() -> bool:
    """Always False: hvdlike's GPU path is CUDA (CuPy, NCCL)."""
    return False


def sycl_built() -> bool:
    """Always False: hvdlike has no SYCL (Intel GPU) path."""
    return False


def gloo_enabled() -> bool:
    """Always False: hvdlike runs on MPI only."""
    return False


def gloo_built() -> bool:
    """Always False: hvdlike has no Gloo controller."""
    return False
