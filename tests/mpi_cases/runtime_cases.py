"""Runtime behaviour seen from each rank: topology, init/shutdown, process sets, join, async."""
from typing import Any, Dict

import numpy as np

import hvdlike as hvd


def topology() -> Dict[str, Any]:
    hvd.init()  # idempotent: a second call changes nothing
    return dict(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                local_size=hvd.local_size(), cross_rank=hvd.cross_rank(),
                cross_size=hvd.cross_size(), homogeneous=hvd.is_homogeneous(),
                threads=hvd.mpi_threads_supported(), mpi_enabled=hvd.mpi_enabled(),
                mpi_built=hvd.mpi_built(), gloo=hvd.gloo_enabled(), nccl=hvd.nccl_built())


def alltoall_return_forms() -> Dict[str, Any]:
    """Horovod's rule: the received rows alone without splits, the pair with them."""
    n, rank = hvd.size(), hvd.rank()
    x = np.arange(2 * n, dtype=np.float32) + 100 * rank
    alone = hvd.alltoall(x)
    pair = hvd.alltoall(x, splits=[2] * n)
    handle = hvd.alltoall_async(x).synchronize()
    return dict(alone_type=type(alone).__name__, alone=alone.tolist(),
                pair=[pair[0].tolist(), pair[1].tolist()], handle_len=len(handle))


def reinit() -> Dict[str, Any]:
    from hvdlike.engine import work

    first = hvd.allreduce(np.ones(2), op=hvd.Sum).tolist()
    ps = hvd.add_process_set([0])
    hvd.allgather(np.ones(1 << 17))  # 1 MiB of result: kept for reuse
    cached = work.results._bytes
    hvd.shutdown()
    was = hvd.is_initialized()
    hvd.init()
    return dict(first=first, initialized_after_shutdown=was, set_id_after=ps.process_set_id,
                again=hvd.allreduce(np.ones(2), op=hvd.Sum).tolist(),
                cached_mib=cached >> 20, cached_after_shutdown=work.results._bytes)


def process_sets() -> Dict[str, Any]:
    rank = hvd.rank()
    evens = hvd.add_process_set([r for r in range(hvd.size()) if r % 2 == 0])
    odds = hvd.add_process_set(hvd.ProcessSet([r for r in range(hvd.size()) if r % 2 == 1]))
    mine = evens if rank % 2 == 0 else odds
    out = dict(ids=(evens.process_set_id, odds.process_set_id), set_rank=mine.rank(),
               set_size=mine.size(), other_rank=(odds if mine is evens else evens).rank(),
               sum=hvd.allreduce(np.array([rank]), op=hvd.Sum, process_set=mine).tolist(),
               gathered=hvd.allgather_object(rank, process_set=mine),
               bcast=hvd.broadcast_object(f"from {mine.ranks[-1]}", root_rank=mine.ranks[-1],
                                          process_set=mine))
    try:
        hvd.add_process_set(evens.ranks)
    except ValueError as exc:
        out["duplicate"] = str(exc)
    out["removed"] = hvd.remove_process_set(odds)
    out["removed_again"] = hvd.remove_process_set(odds)
    out["global_sum"] = hvd.allreduce(np.array([1]), op=hvd.Sum).tolist()
    hvd.remove_process_set(evens)  # removed ids come back first-removed first, as in Horovod
    first, second = hvd.add_process_set([0]), hvd.add_process_set([0, 1])
    out["reused_ids"] = (first.process_set_id, second.process_set_id)
    out["str"] = str(first)
    # second has evens' id: rank 0 made unnamed calls on evens, rank 1 none; an unnamed call
    # must still pair up (the numbering of unnamed calls starts again with the new set)
    out["reused_sum"] = hvd.allreduce(np.array([rank]), op=hvd.Sum, process_set=second).tolist() \
        if second.included() else None
    return out


def removing_a_set_fails_what_not_every_member_submitted() -> Dict[str, Any]:
    """Rank 0 submits a request on the set [0, 2] that rank 2 never does; the set is removed:
    rank 0's handle raises; a new set (same id, same members, same name) works."""
    rank = hvd.rank()
    ps = hvd.add_process_set([0, 2])
    handle = hvd.allreduce_async(np.ones(2), name="x", process_set=ps) if rank == 0 else None
    hvd.barrier()  # rank 0's request is pending in the engine before the set goes
    out: Dict[str, Any] = dict(removed=hvd.remove_process_set(ps))
    if handle is not None:
        try:
            out["result"] = hvd.synchronize(handle).tolist()
        except RuntimeError as exc:
            out["error"] = str(exc)
    again = hvd.add_process_set([0, 2])
    out["id"] = again.process_set_id
    if again.included():
        out["sum"] = hvd.allreduce(np.full(2, rank + 1.0), op=hvd.Sum, name="x",
                                   process_set=again).tolist()
    out["world"] = hvd.allreduce(np.ones(1), op=hvd.Sum).tolist()
    return out


def collectives_submitted_before_a_removal_run_first() -> Dict[str, Any]:
    """Add a set, submit a collective on it, remove it, many times over: once the unnamed names
    of the removals repeat (the engine caches them), a removal and the collective are decided
    in the same round, the removal first; the collective must still run before it."""
    from hvdlike.engine.engine import NONAME_NAMES

    rank, results = hvd.rank(), []
    for i in range(NONAME_NAMES + 2):
        ps = hvd.add_process_set([0])
        handle = hvd.allgather_async(np.full(1, i), name=f"g{i}", process_set=ps) \
            if ps.included() else None
        hvd.remove_process_set(ps)
        if handle is not None:
            results.append(int(hvd.synchronize(handle)[0]))
    return dict(right=results == list(range(NONAME_NAMES + 2)) if rank == 0 else results == [])


def request_reaching_the_engine_after_its_sets_removal() -> Dict[str, Any]:
    """A request that passed the API's membership check just before another thread removed
    its set reaches the engine afterwards (submitted to the engine directly here, as that
    race would): it fails, and the job goes on."""
    from hvdlike import runtime
    from hvdlike.engine.checks import Request

    ps = hvd.add_process_set([0])
    hvd.remove_process_set(ps)
    out: Dict[str, Any] = {}
    if hvd.rank() == 0:
        x = np.ones(2)
        request = Request("allreduce", "late", x.dtype, x.shape, int(hvd.Sum), None, (1.0, 1.0))
        handle = runtime.state().engine.submit(request, None, [x], ps)
        try:
            out["result"] = handle.synchronize().tolist()
        except RuntimeError as exc:
            out["error"] = str(exc)
    out["after"] = hvd.allreduce(np.ones(1), op=hvd.Sum, name="after").tolist()
    return out


def join(batches: Any) -> Dict[str, Any]:
    """Rank r has batches[r] steps of data; each step allreduces; then join()."""
    rank = hvd.rank()
    sums = []
    for step in range(batches[rank]):
        value = np.full(3, float(rank + 1 + step), np.float32)
        sums.append(hvd.allreduce(value, op=hvd.Sum, name="grad").tolist())
        grouped = hvd.grouped_allreduce([value, np.ones(2, np.int32)], op=hvd.Average)
        sums.append([g.tolist() for g in grouped])
    last = hvd.join()
    after = hvd.allreduce(np.ones(1), op=hvd.Sum).tolist()
    return dict(sums=sums, last=last, after=after)


def join_then_allgather() -> Dict[str, Any]:
    """Only allreduce may run while a rank has joined: anything else is an error on all ranks."""
    try:
        if hvd.rank() == 0:
            hvd.join()
        else:
            hvd.allgather(np.ones(1))
        return dict(error=None)
    except ValueError as exc:
        return dict(error=str(exc))


def async_ops() -> Dict[str, Any]:
    rank = hvd.rank()
    handles = [hvd.allreduce_async(np.full(1000, rank, np.float64), op=hvd.Sum),
               hvd.allgather_async(np.full((1, 2), rank)),
               hvd.broadcast_async(np.full(2, rank), root_rank=0)]
    polled = [h.poll() for h in handles]
    results = [hvd.synchronize(h) for h in handles]
    return dict(polled_types=[type(p).__name__ for p in polled],
                sum=float(results[0][0]), gathered=results[1][:, 0].tolist(),
                bcast=results[2].tolist(), poll_after=[hvd.poll(h) for h in handles],
                same_result=handles[0].synchronize() is results[0])


def held_results_never_change() -> Dict[str, Any]:
    """Large results come from a reusing cache: arrays the program holds must never change,
    and dropped ones are reused (same memory) on the next call of that shape."""
    rank, size = hvd.rank(), hvd.size()
    n = 64 * 1024  # 256 KiB of float32: above the cache's minimum
    first = hvd.allreduce(np.full(n, rank + 1.0, np.float32), op=hvd.Sum)
    second = hvd.allreduce(np.full(n, 10.0 * (rank + 1), np.float32), op=hvd.Sum)
    gathered = hvd.allgather(np.full((n // 4, 4), rank, np.float32))
    # bool results are views of a cached uint8 buffer: held, it must not be handed out again
    flags = hvd.allreduce(np.full(4 * n, rank == 0), op=hvd.Sum)
    flags_again = hvd.allreduce(np.full(4 * n, False), op=hvd.Sum)
    view = second[::2]
    address = first.ctypes.data
    del first
    third = hvd.allreduce(np.full(n, 100.0, np.float32), op=hvd.Average)
    total = size * (size + 1) / 2
    return dict(second_intact=bool((view == 10 * total).all()) and bool((second == 10 * total).all())
                and bool(flags.all()) and not bool(flags_again.any()),
                gathered_intact=bool((gathered[: n // 4] == 0).all()),
                third=float(third[0]) if (third == third[0]).all() else None,
                reused=third.ctypes.data == address,
                distinct=len({second.ctypes.data, third.ctypes.data, gathered.ctypes.data}) == 3)


def non_contiguous_inputs() -> Dict[str, Any]:
    """Strided and transposed inputs are copied, not rejected; results match contiguous ones."""
    rank = hvd.rank()
    base = np.arange(24, dtype=np.float64).reshape(4, 6) * (rank + 1)
    transposed, strided = base.T, base[:, ::2]
    return dict(
        flags=(transposed.flags.c_contiguous, strided.flags.c_contiguous),
        allreduce=hvd.allreduce(transposed, op=hvd.Sum).tolist(),
        allgather=hvd.allgather(strided).tolist(),
        broadcast=hvd.broadcast(strided, root_rank=1).tolist(),
        grouped=[g.tolist() for g in hvd.grouped_allreduce([transposed, strided], op=hvd.Max)],
        from_list=hvd.allreduce([1, 2, 3], op=hvd.Sum).tolist(),
        from_memoryview=hvd.allreduce(memoryview(np.ones(3, np.float32)), op=hvd.Sum).tolist())


def settings_differ_between_ranks() -> Dict[str, Any]:
    """Rank 1 re-initializes with another fusion threshold: init fails on every rank."""
    import os
    rank = hvd.rank()
    hvd.shutdown()
    os.environ["HVDLIKE_FUSION_THRESHOLD"] = "1024" if rank == 1 else "2048"
    try:
        hvd.init()
    except ValueError as exc:
        error = str(exc)
    else:
        error = None
    del os.environ["HVDLIKE_FUSION_THRESHOLD"]
    hvd.init()
    return dict(error=error, sum=hvd.allreduce(np.ones(1), op=hvd.Sum).tolist())


def failed_init_leaves_nothing_behind() -> Dict[str, Any]:
    """init() that fails half-way (a process set naming a rank that does not exist, node
    names of the wrong length) leaves no runtime: a later init() really starts again."""
    import os

    hvd.shutdown()
    out: Dict[str, Any] = {}
    try:
        hvd.init(process_sets=[hvd.ProcessSet([0, 7])])
    except ValueError as exc:
        out["bad set"] = str(exc)
    out["initialized after bad set"] = hvd.is_initialized()
    os.environ["HVDLIKE_NODE_NAMES"] = "a"
    try:
        hvd.init()
    except ValueError as exc:
        out["bad names"] = str(exc).split(":")[0]
    del os.environ["HVDLIKE_NODE_NAMES"]
    out["initialized after bad names"] = hvd.is_initialized()
    hvd.init(process_sets=[hvd.ProcessSet([0])])
    out["sum"] = hvd.allreduce(np.ones(1), op=hvd.Sum).tolist()
    out["sets"] = len(hvd.process_sets.registered())
    return out


def init_on_listed_ranks(lists: Dict[int, Any]) -> Dict[str, Any]:
    """Horovod's ``init(comm=[ranks])``, ``lists[world rank]`` on each rank; then the world
    again (the harness needs it)."""
    from mpi4py import MPI
    me = MPI.COMM_WORLD.Get_rank()
    hvd.shutdown()
    try:
        hvd.init(comm=lists[me])
    except ValueError as e:
        out: Dict[str, Any] = {"error": str(e)}
    else:
        out = {"rank": hvd.rank(), "size": hvd.size(),
               "sum": hvd.allreduce(np.array([float(me)]), op=hvd.Sum, name="w").tolist(),
               "gathered": hvd.allgather(np.array([me])).tolist()}
        hvd.shutdown()
    hvd.init()
    return out


def sets_from_communicators() -> Dict[str, Any]:
    """Horovod's init(process_sets=[ProcessSet(comm), ...]): a split communicator (evens on
    even ranks, odds on odd ones), copies of it and of the world, a list of ranks equal to
    one of them, [0], a communicator this rank is not in (COMM_NULL) for ranks 0 and 1
    only, and global_process_set. Then what Horovod's names report and collectives on the sets."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    me, n = world.Get_rank(), world.Get_size()
    hvd.shutdown()
    split = world.Split(color=me % 2, key=me)
    low = world.Create_group(world.Get_group().Incl([0, 1]))  # COMM_NULL on ranks >= 2
    given = [hvd.ProcessSet(split), hvd.ProcessSet(range(0, n, 2)), hvd.ProcessSet(world.Dup()),
             hvd.ProcessSet(split.Dup()), hvd.ProcessSet([0]), hvd.ProcessSet(low),
             hvd.global_process_set]
    hvd.init(comm=world, process_sets=given)
    out: Dict[str, Any] = dict(
        table={str(k): v for k, v in hvd.get_process_set_ids_and_ranks().items()},
        ids=[ps.process_set_id for ps in given],
        comm_ids=[hvd.comm_process_set_id(c) for c in (world, split, world.Dup())],
        split=(given[0].ranks, given[0].rank(), given[0].size(), given[0].included()),
        split_sum=hvd.allreduce(np.array([me]), op=hvd.Sum, process_set=given[0]).tolist())
    try:
        hvd.allreduce(np.ones(1), process_set=given[3])
    except ValueError as exc:
        out["twin"] = str(exc)
    try:
        hvd.add_process_set(hvd.ProcessSet(split))
    except NotImplementedError as exc:
        out["add_comm"] = str(exc)
    try:
        hvd.comm_process_set_id(MPI.COMM_NULL)
    except ValueError as exc:
        out["null_id"] = str(exc)
    try:
        hvd.ProcessSet(5)
    except TypeError as exc:
        out["not_a_set"] = str(exc)
    hvd.shutdown()
    try:  # lists of ranks must agree; a communicator may differ
        hvd.init(process_sets=[hvd.ProcessSet([me])])
    except hvd.CollectiveMismatchError as exc:
        out["mismatch"] = str(exc)
    out["initialized after mismatch"] = hvd.is_initialized()
    try:  # a bad list on one rank: the same error on every rank
        hvd.init(process_sets=[[0, 0] if me == 0 else [0]])
    except ValueError as exc:
        out["bad list"] = str(exc)
    hvd.init()
    for c in (split, low):
        if c != MPI.COMM_NULL:
            c.Free()
    return out


def a_rank_shuts_down_first() -> Dict[str, Any]:
    """The last rank shuts hvdlike down while the others go on: collectives of a set without
    it still run; ones that need it (cached name, new name, join) fail at once."""
    me, n = hvd.rank(), hvd.size()
    others = hvd.add_process_set(list(range(n - 1)))
    hvd.allreduce(np.ones(2), name="cached")  # in the response cache on every rank
    out: Dict[str, Any] = {}
    if me == n - 1:
        hvd.shutdown()  # returns once every rank has shut down
        out["left"] = True
    else:
        out["set_sums"] = [hvd.allreduce(np.array([float(me)]), op=hvd.Sum, name=f"s{i}",
                                         process_set=others).tolist() for i in range(2)]
        for name in ("cached", "fresh", "join"):
            try:
                if name == "join":
                    hvd.join()
                else:
                    hvd.allreduce(np.ones(2), name=name)
                out[name] = "completed"
            except RuntimeError as exc:
                out[name] = str(exc)
        hvd.shutdown()
    hvd.init()
    return out
