"""The on-node shared-memory all-reduce seen from each rank: window growth, rounds, topology,
fallback to MPI, the single-copy (cross-memory attach) path and its fallbacks, and teardown."""
import ctypes
import errno
import hashlib
import os
import platform
import struct
import subprocess
import sys
from typing import Any, Dict, List

import numpy as np

import hvdlike as hvd
from hvdlike.transport import cma, shm
from timeline_cases import read_own

OPS = ["Sum", "Average", "Min", "Max", "Product"]


def _reducer(ps: Any, name: str) -> Any:
    """The process set's on-node transport ``name`` ("shm", "cma"), or None."""
    return None if ps.group is None else ps.group.reducers.get(name)


def inputs(nbytes: int, dtype: str, rank: int) -> np.ndarray:
    """Small integer values (exact in any order of float additions), distinct per rank."""
    n = nbytes // np.dtype(dtype).itemsize
    base = np.arange(n, dtype=np.int64) % 5 - 2
    if dtype == "bool":
        return (base + rank) % 3 == 0
    return (base + rank).astype(dtype)


def sizes_and_ops(sizes: List[int], dtypes: List[str]) -> Dict[str, Any]:
    """Every size x dtype x op, blocking and grouped, plus the window's capacity after."""
    out: Dict[str, Any] = {}
    for nbytes in sizes:
        for dtype in dtypes:
            x = inputs(nbytes, dtype, hvd.rank())
            for op in (["Sum", "Min"] if dtype == "bool" else OPS):
                out[f"{nbytes}-{dtype}-{op}"] = hvd.allreduce(x, op=getattr(hvd, op))
            grouped = hvd.grouped_allreduce([x, x[: x.size // 3]], op=hvd.Max)
            out[f"{nbytes}-{dtype}-grouped"] = grouped
    reducer = _reducer(hvd.global_process_set, "shm")
    out["capacity"] = None if reducer is None else reducer._capacity
    out["cma"] = _reducer(hvd.global_process_set, "cma") is not None
    return out


def identical_bits(nbytes: int) -> Dict[str, Any]:
    """Random float32 data: the result's bytes, hashed, must be the same on every rank."""
    x = np.random.default_rng(hvd.rank()).standard_normal(nbytes // 4, dtype=np.float32)
    got = hvd.allreduce(x, op=hvd.Sum)
    return dict(digest=hashlib.sha256(got.tobytes()).hexdigest(),
                close=bool(np.allclose(got, _sum_of_all_ranks(nbytes), rtol=1e-5, atol=1e-5)))


def _sum_of_all_ranks(nbytes: int) -> np.ndarray:
    xs = [np.random.default_rng(r).standard_normal(nbytes // 4, dtype=np.float32)
          for r in range(hvd.size())]
    return np.sum(np.stack(xs).astype(np.float64), axis=0)


def who_uses_shared_memory() -> Dict[str, Any]:
    """Which process sets got a shared-memory reducer, and that each still reduces right."""
    sets = {"global": hvd.global_process_set, "01": hvd.add_process_set([0, 1]),
            "12": hvd.add_process_set([1, 2]), "3": hvd.add_process_set([3])}
    out: Dict[str, Any] = {}
    for name, ps in sets.items():
        if ps.included():
            x = np.full(1 << 18, hvd.rank() + 1, np.float32)  # 1 MiB: above the threshold
            window = _reducer(ps, "shm")
            out[name] = dict(shm=window is not None,
                             hierarchical=window is not None and window.across is not None,
                             cma=_reducer(ps, "cma") is not None,
                             sum=float(hvd.allreduce(x, op=hvd.Sum, process_set=ps)[0]))
    return out


def dev_shm_full_on_last_rank() -> Dict[str, Any]:
    """The last rank sees no room in /dev/shm: every rank must fall back to MPI together."""
    if hvd.rank() == hvd.size() - 1:
        class Full:
            f_bavail, f_frsize = 0, 4096
        shm.os.statvfs = lambda path: Full()  # type: ignore[assignment]
    x = np.full(1 << 18, hvd.rank() + 1, np.float32)
    first = hvd.allreduce(x, op=hvd.Sum)
    again = hvd.allreduce(x, op=hvd.Sum)
    reducer = _reducer(hvd.global_process_set, "shm")
    return dict(first=float(first[0]), again=float(again[-1]), capacity=reducer._capacity,
                no_room=reducer._no_room)


def windows_survive_shutdown_and_init() -> Dict[str, Any]:
    x = np.ones(1 << 20, np.float32)
    first = float(hvd.allreduce(x, op=hvd.Sum)[0])
    hvd.shutdown()
    hvd.init()
    second = float(hvd.allreduce(x, op=hvd.Sum)[0])
    pairs = hvd.add_process_set([0, 1])
    third = float(hvd.allreduce(x, op=hvd.Sum, process_set=pairs)[0]) if pairs.included() else None
    hvd.remove_process_set(pairs)
    return dict(first=first, second=second, third=third)


def auto_choice(sizes: List[int], after: int) -> Dict[str, Any]:
    """All-reduces of each size under HVDLIKE_HIERARCHICAL_ALLREDUCE=auto, as many as its
    warm-up and trials take plus ``after``: every result, and what the choice tried and kept
    per size class."""
    from hvdlike.transport import choice as auto
    calls = 1 + 2 * auto.TRIALS + after
    sums = []
    for nbytes in sizes:
        for i in range(calls):
            x = inputs(nbytes, "float32", hvd.rank() + i)
            sums.append(hvd.allreduce(x, op=hvd.Sum, name=f"auto.{nbytes}.{i}"))
    choice = hvd.global_process_set.group.choices["shm"]
    return dict(sums=sums, calls=calls, trials=auto.TRIALS, picked=dict(choice.picked),
                tried={c: (len(f), len(h)) for c, (f, h) in choice._times.items()})


def cma_auto_choice(sizes: List[int], after: int, timeline: str) -> Dict[str, Any]:
    """All-reduces of each size under HVDLIKE_CMA=auto, as many as the warm-up and trials
    take plus ``after``: every result, which reducer ran each call (from the timeline), and
    what the choice tried and kept per size class."""
    from hvdlike.transport import choice as auto
    calls = 1 + 2 * auto.TRIALS + after
    sums = []
    hvd.start_timeline(timeline)
    for nbytes in sizes:
        for i in range(calls):
            x = inputs(nbytes, "float32", hvd.rank() + i)
            sums.append(hvd.allreduce(x, op=hvd.Sum, name=f"cma.{nbytes}.{i}"))
    hvd.stop_timeline()
    ran = [e["name"] for e in sorted(read_own(timeline), key=lambda e: e.get("ts", 0))
           if e["name"] in ("CMA_ALLREDUCE", "SHM_ALLREDUCE", "MPI_ALLREDUCE")]
    choice = hvd.global_process_set.group.choices["cma"]
    return dict(sums=sums, calls=calls, trials=auto.TRIALS, ran=ran, picked=dict(choice.picked),
                tried={c: (len(f), len(h)) for c, (f, h) in choice._times.items()})


def cma_auto_window_growth(first: int, larger: int, keep_window: bool,
                           timeline: str) -> Dict[str, Any]:
    """Under HVDLIKE_CMA=auto: all-reduces of ``first`` bytes until their size class is
    decided, the decision then set to ``keep_window`` on every rank (as if measured so), then
    one all-reduce of ``larger`` bytes (the same class): the window's capacity before and after
    it, which reducer ran it (from the timeline), and its sum."""
    from hvdlike.transport import choice as auto
    for i in range(1 + 2 * auto.TRIALS):
        hvd.allreduce(inputs(first, "float32", hvd.rank() + i), op=hvd.Sum, name=f"first.{i}")
    choice = hvd.global_process_set.group.choices["cma"]
    assert list(choice.picked) == [first.bit_length()] == [larger.bit_length()], choice.picked
    choice.picked[first.bit_length()] = keep_window
    window = _reducer(hvd.global_process_set, "shm")
    before = window._capacity
    hvd.start_timeline(timeline)
    total = hvd.allreduce(inputs(larger, "float32", hvd.rank()), op=hvd.Sum, name="larger")
    hvd.stop_timeline()
    ran = [e["name"] for e in read_own(timeline)
           if e["name"] in ("CMA_ALLREDUCE", "SHM_ALLREDUCE")]
    return dict(before=before, after=window._capacity, ran=ran, total=total)


def _refused(*args: Any) -> int:
    """A process_vm_readv/writev that fails as the kernel's refusal does (it can be undone,
    unlike :func:`_deny_cross_memory_attach`)."""
    ctypes.set_errno(errno.EPERM)
    return -1


# per machine: the seccomp audit arch, process_vm_readv, process_vm_writev, seccomp
SECCOMP_SYSCALLS = {"x86_64": (0xC000003E, 310, 311, 317),
                    "aarch64": (0xC00000B7, 270, 271, 277)}


def _deny_cross_memory_attach() -> None:
    """From now on the kernel refuses this process's process_vm_readv/writev with EPERM, in
    every thread (a seccomp filter, as a container's profile would be; it cannot be undone)."""
    arch, readv, writev, seccomp = SECCOMP_SYSCALLS[platform.machine()]

    def insn(code: int, jt: int, jf: int, k: int) -> bytes:
        return struct.pack("HBBI", code, jt, jf, k)
    load, jeq, ret = 0x20, 0x15, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_RET|K
    program = ctypes.create_string_buffer(b"".join([
        insn(load, 0, 0, 4),  # seccomp_data.arch
        insn(jeq, 0, 3, arch),  # another ABI: allow
        insn(load, 0, 0, 0),  # seccomp_data.nr
        insn(jeq, 2, 0, readv),
        insn(jeq, 1, 0, writev),
        insn(ret, 0, 0, 0x7FFF0000),  # SECCOMP_RET_ALLOW
        insn(ret, 0, 0, 0x00050000 | errno.EPERM)]))  # SECCOMP_RET_ERRNO

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS, which a filter requires
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    prog = Program(len(program.raw) // 8, ctypes.addressof(program))
    # SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC: every thread (the engine's too)
    if libc.syscall(seccomp, 1, 1, ctypes.byref(prog)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER)")


def cma_refused_on_last_rank() -> Dict[str, Any]:
    """The kernel refuses the last rank's attaching to its peers' memory: after init again, no
    rank may use the single-copy reducer, and a bucket above its threshold
    (HVDLIKE_CMA_THRESHOLD=0) goes through the shared-memory window, right."""
    unfiltered = None  # why the kernel could not be made to refuse (the test then skips)
    if hvd.rank() == hvd.size() - 1:
        try:
            _deny_cross_memory_attach()
        except OSError as exc:
            unfiltered = str(exc)
    hvd.shutdown()
    hvd.init()
    x = np.full(1 << 18, hvd.rank() + 1, np.float32)
    return dict(unfiltered=unfiltered, cma=_reducer(hvd.global_process_set, "cma") is not None,
                sum=float(hvd.allreduce(x, op=hvd.Sum)[-1]),
                capacity=_reducer(hvd.global_process_set, "shm")._capacity)


def cma_fails_on_last_rank(how: str) -> Dict[str, Any]:
    """On the last rank only, a copy fails (``how="copy"``) or the reduction raises something
    else (``"error"``) in the middle of an all-reduce: every rank must get an error (not a hang,
    not a wrong result), and the next all-reduce, with everything working again, is right."""
    reducer = _reducer(hvd.global_process_set, "cma")
    assert isinstance(reducer, cma.CrossMemoryAllreduce), type(reducer)
    x = np.full(1 << 18, hvd.rank() + 1, np.float32)
    if hvd.rank() == hvd.size() - 1:
        if how == "copy":
            reducer._write = cma._Copier(_refused)
        else:
            def broken(*args: Any) -> None:
                raise ValueError("a bug in the reduction")
            reducer._reduce_pieces = broken
    try:
        hvd.allreduce(x, op=hvd.Sum, name="fails")
        error = None
    except cma.CopyFailed as e:
        error = str(e)
    reducer.__dict__.pop("_reduce_pieces", None)
    reducer._write = cma._Copier(cma._CALLS[1])
    return dict(error=error, after=float(hvd.allreduce(x, op=hvd.Sum, name="after")[0]))


def cma_peer_gone_on_last_rank() -> Dict[str, Any]:
    """On the last rank only, the single-copy reducer's peer 0 is a process that has died and
    not yet been reaped, as a rank killed in the middle of an all-reduce is until its launcher
    waits for it (the kernel answers ESRCH): every rank must raise ``PeerGone``, which the
    engine takes for a dead rank. The reducer is a private one on a copy of the world, called
    directly (through the engine this would end it)."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD.Dup()
    reducer = cma.CrossMemoryAllreduce.create(comm)
    assert reducer is not None
    child = None
    if hvd.rank() == hvd.size() - 1:
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped
        reducer._pids[0] = child.pid
    x = np.full(1 << 18, hvd.rank() + 1, np.float32)
    try:
        reducer.allreduce_many([x], [np.empty_like(x)], hvd.Sum)
        error = None
    except cma.CopyFailed as e:
        error = dict(type=type(e).__name__, errno=e.errno, text=str(e))
    if child is not None:
        child.wait()
    comm.Free()
    return dict(error=error)


def _one_after_another(arrays: List[np.ndarray]) -> bool:
    """Whether the non-empty ``arrays`` lie one after another in memory, in order."""
    arrays = [a for a in arrays if a.size]
    return all(a.ctypes.data + a.nbytes == b.ctypes.data for a, b in zip(arrays, arrays[1:]))


def grouped_views_of_one_array() -> Dict[str, Any]:
    """A grouped all-reduce of small tensors that are views of one array, one after another,
    and a large one: the results, whether the inputs are unchanged, and whether the small
    results lie one after another (the engine packs small tensors on one node and unpacks
    none of their results)."""
    shapes = [(3, 4), (), (0,), (7,), (100, 5)]
    flat = np.arange(sum(int(np.prod(s)) for s in shapes), dtype=np.float32) + hvd.rank()
    views, at = [], 0
    for s in shapes:
        views.append(flat[at:at + int(np.prod(s))].reshape(s))
        at += int(np.prod(s))
    big = np.full(1 << 15, hvd.rank() + 1.0, np.float32)  # 128 KiB: not packed
    before = flat.copy()
    outs = hvd.grouped_allreduce(views[:2] + [big] + views[2:], op=hvd.Sum)
    small = outs[:2] + outs[3:]
    return dict(small=[o.tolist() for o in small], shapes=[o.shape for o in small],
                big=sorted(set(outs[2].tolist())), inputs_unchanged=bool((flat == before).all()),
                one_after_another=_one_after_another(small))


def cma_grouped_results_stay_put() -> Dict[str, Any]:
    """Grouped all-reduces through the single-copy path return views of one result array,
    which is reused only once nothing holds any of them: a result kept from the first call
    must not change in the second, and once dropped its memory is reused."""
    xs = [np.full(n, hvd.rank() + 1.0, np.float32) for n in (1 << 18, 3 << 16, 5)]
    first = hvd.grouped_allreduce(xs, op=hvd.Sum)
    kept, where = first[1], first[1].ctypes.data
    del first
    second = hvd.grouped_allreduce([x * 10 for x in xs], op=hvd.Sum)
    moved, second_at = second[1].ctypes.data != where, second[1].ctypes.data
    del second
    third = hvd.grouped_allreduce(xs, op=hvd.Sum)
    return dict(kept=sorted(set(kept.tolist())), moved=moved,
                kept_memory_reused=any(t.ctypes.data == where for t in third),
                dropped_memory_reused=third[1].ctypes.data == second_at,
                third=[sorted(set(t.tolist())) for t in third])


class _ReduceThenBroadcast:
    """An on-node transport made for the test of registering one: MPI_Reduce to the node's
    first rank, then MPI_Bcast, of the concatenated arrays."""

    def __init__(self, comm: Any) -> None:
        self._comm = comm
        self.across = None
        self.freed = 0

    @property
    def activity(self) -> str:
        return "REDUCE_BCAST_ALLREDUCE"

    def reserve(self, nbytes: int) -> bool:
        return True

    def allreduce_many(self, sends: List[np.ndarray], recvs: List[np.ndarray], op: Any,
                       finish: Any = None) -> None:
        from mpi4py import MPI
        assert op == hvd.Sum, op
        send = np.concatenate([s.reshape(-1) for s in sends])
        total = np.empty_like(send)
        self._comm.Reduce(send, total, MPI.SUM, root=0)
        self._comm.Bcast(total, root=0)
        if finish is not None:
            finish(total)
        at = 0
        for r in recvs:
            r.reshape(-1)[:] = total[at:at + r.size]
            at += r.size

    def free(self) -> None:
        self.freed += 1


def registered_transport(sizes: List[int], timeline: str) -> Dict[str, Any]:
    """A third on-node transport registered in ``ON_NODE`` (from 1 MiB, above the window):
    the all-reduce of each size, which transport ran it (from the timeline), and whether the
    global set's transports were freed at shutdown."""
    from hvdlike.transport import group
    from hvdlike.transport.interface import OnNodeTransport
    built: List[_ReduceThenBroadcast] = []

    def build(comm: Any, across: Any, settings: Any) -> Any:
        built.append(_ReduceThenBroadcast(comm))
        return built[-1] if across is None else None

    added = OnNodeTransport(name="reduce_bcast", build=build, threshold=lambda s: 1 << 20,
                            timed=lambda s, by_node: False)
    group.ON_NODE = group.ON_NODE + (added,)
    hvd.shutdown()
    hvd.init()
    hvd.start_timeline(timeline)
    sums = [hvd.allreduce(inputs(n, "float32", hvd.rank()), op=hvd.Sum, name=f"r.{n}")
            for n in sizes]
    hvd.stop_timeline()
    ran = [e["name"] for e in sorted(read_own(timeline), key=lambda e: e.get("ts", 0))
           if e["name"] in ("MPI_ALLREDUCE", "SHM_ALLREDUCE", "REDUCE_BCAST_ALLREDUCE")]
    registered = sorted(hvd.global_process_set.group.reducers)
    hvd.shutdown()
    freed = [b.freed for b in built]
    hvd.init()
    return dict(sums=sums, ran=ran, registered=registered, freed=freed)
