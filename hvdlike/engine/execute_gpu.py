"""How a ready response of GPU arrays moves its data: NCCL, or staged through host memory.

The first GPU collective of a process set chooses its transport, on every member at the same
point of the run order: the members all-gather (NCCL loads here?, which GPU is mine?). NCCL
serves the set when every member has it and no two members share a GPU; otherwise the arrays
are staged (device -> pinned host memory -> the host transports -> device), with one warning
per job. ``HVDLIKE_GPU_TRANSPORT`` forces either (``nccl``: an error on every rank if NCCL
cannot serve the set, naming why and what to install).

NCCL work runs on the engine's stream for the device after that stream has waited for the
event recorded on the caller's stream at submission; each result carries an event recorded
after it (see ``hvdlike.transport.gpu``). All-reduces that became ready together are fused by bytes
into a device fusion buffer that is kept from step to step; one tensor alone is reduced from
its memory straight into its result.
"""
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..base import dtypes, log
from ..base.reduce_ops import ReduceOp
from ..transport import gpu
from ..transport import nccl as nccl_transport
from ..transport import staged as staging
from . import allreduce, execute, fusion
from .checks import Kind, Request
from .execute import scatter_rows
from .scaling import half, scale_in_place, scaler
from .work import Phases, Work, row_bytes
from .world import World

STAGED = "staged"
_transports: Dict[int, Any] = {}  # process set id -> nccl_transport.Communicator or STAGED
_fusion_buffers: Dict[Tuple[int, np.dtype], Any] = {}  # (device, dtype) -> flat CuPy array
_warned: List[bool] = []


def forget_set(set_id: int) -> None:
    _transports.pop(set_id, None)


def reset() -> None:
    """Drop communicators and buffers (shutdown)."""
    _transports.clear()
    _fusion_buffers.clear()


# ----------------------------------------------------------------------------- choosing

def _transport(st: World, work: Work, device_id: int) -> Any:
    ps = work.process_set
    chosen = _transports.get(ps.process_set_id)
    if chosen is None:
        chosen = _transports[ps.process_set_id] = _choose(st, ps, device_id)
    return chosen


def _choose(st: World, ps: Any, device_id: int) -> Any:
    setting = st.settings.gpu_transport
    try:
        gpu.nccl_module()
        missing = None
    except ImportError as exc:
        missing = str(exc)
    identity = nccl_transport.device_identity(gpu.cupy(), device_id)
    every = st.transport.allgather_object(ps.group.comm, (missing, identity))
    if setting == STAGED:
        return STAGED
    reasons = []
    without = [r for r, (m, _) in enumerate(every) if m]
    if without:
        reasons.append(f"ranks {without} of the set cannot load NCCL ({every[without[0]][0]})")
    for _, ranks in nccl_transport.shares_gpu([i for _, i in every]):
        reasons.append(f"ranks {ranks} of the set share one GPU, which NCCL refuses")
    if not reasons:
        return nccl_transport.Communicator(ps.group.comm, device_id)
    why = "; ".join(reasons)
    if setting == "nccl":
        raise RuntimeError(f"HVDLIKE_GPU_TRANSPORT=nccl, but NCCL cannot serve {ps}: {why}. "
                           "Give each rank its own GPU (hvdlike.pin_gpu()), install "
                           f"{gpu.NCCL_PACKAGES}, or unset HVDLIKE_GPU_TRANSPORT to stage "
                           "through host memory")
    if not _warned and ps.group.rank == 0:
        _warned.append(True)
        log.logger.warning(f"GPU collectives on {ps} go through host memory: {why}. Set "
                           "HVDLIKE_GPU_TRANSPORT=staged to choose this path knowingly")
    return STAGED


# ----------------------------------------------------------------------------- entry points

def _device_of(work: Work) -> int:
    first = _first_array(work.inputs.inputs)
    return first.device.id if first is not None else gpu.cupy().cuda.Device().id


def _first_array(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        for v in value:
            found = _first_array(v)
            if found is not None:
                return found
        return None
    return None if isinstance(value, np.ndarray) else value


def run_allreduces(st: World, works: Sequence[Work],
                   trace: Optional[Callable[[List[int], Phases, Dict[str, Any]], None]] = None
                   ) -> None:
    """Run every GPU all-reduce response of a round (see ``allreduce.run_allreduces``)."""
    staged: List[Tuple[int, Work, Any, int]] = []
    direct: List[Tuple[int, Work, Any, int]] = []
    for w, work in enumerate(works):
        device = _device_of(work)
        t = _transport(st, work, device)
        (staged if t is STAGED else direct).append((w, work, t, device))
    if staged:  # results in pinned memory, so that their copies to the GPU are fast
        allreduce.run_allreduces(st, [_staged(work, device) for _, work, _, device in staged],
                                 trace and (lambda m, p, a: trace([staged[i][0] for i in m], p, a)),
                                 staging.pinned_empty)
    if direct:
        _nccl_allreduces(st, direct, trace)


def run(st: World, work: Work) -> Any:
    """Run one GPU response of another collective; returns the ``gpu.DeviceResult``."""
    device = _device_of(work)
    t = _transport(st, work, device)
    cp = gpu.cupy()
    with cp.cuda.Device(device):
        if t is STAGED:
            host = _staged(work, device)
            return _on_device(execute.RUNNERS[work.request.kind](st, host), work,
                              host.inputs_stream)
        stream = _stream_after([work], device)
        with stream:
            value = _NCCL_RUNNERS[work.request.kind](st, work, t, stream)
        return _finished(value, work, stream)


def zeros_for(request: Request) -> gpu.OnDevice:
    """What a rank that has joined contributes to a GPU all-reduce: zeros on its GPU."""
    cp = gpu.cupy()
    shapes, types = ((request.shape, request.dtype) if request.kind == Kind.GROUPED_ALLREDUCE
                     else ([request.shape], [request.dtype]))
    with gpu.engine_stream(cp.cuda.Device().id):  # the stream that will read them
        return gpu.OnDevice([cp.zeros(s, d) for s, d in zip(shapes, types)], None, None)


# ----------------------------------------------------------------------------- helpers

def _stream_after(works: Sequence[Work], device: int) -> Any:
    """The stream that runs these works, ordered after what their callers enqueued before
    submitting: the callers' one stream when all are blocking calls from it, else the
    engine's, made to wait for each caller's event."""
    first = works[0].inputs.stream
    if first is not None and all(w.inputs.stream is first for w in works[1:]):
        return first
    stream = gpu.engine_stream(device)
    with gpu.cupy().cuda.Device(device):
        for w in works:
            if w.inputs.ready is not None:
                stream.wait_event(w.inputs.ready)
            elif w.inputs.stream is not None:  # a blocking caller enqueues nothing meanwhile
                stream.wait_event(w.inputs.stream.record())
    return stream


def _finished(value: Any, work: Work, stream: Any) -> gpu.DeviceResult:
    """The result, with the event its caller's stream must wait for (none when the work ran
    on that very stream)."""
    if stream is work.inputs.stream:
        return gpu.DeviceResult(value, None, work.inputs)
    done = gpu.cupy().cuda.Event(block=False, disable_timing=True)
    done.record(stream)
    return gpu.DeviceResult(value, done, work.inputs)


def _on_device(value: Any, work: Work, stream: Any) -> gpu.DeviceResult:
    with stream:
        result = _finished(staging.to_device(value, stream), work, stream)
    # a copy from pinned memory runs after set() returns: the host arrays (from CuPy's pinned
    # pool, reused as soon as they are dropped) must outlive it
    stream.synchronize()
    return result


def _staged(work: Work, device: int) -> Work:
    """The host form of a GPU work: its inputs copied to pinned host memory, its result
    copied back to the GPU before ``work.done`` gets it."""
    cp = gpu.cupy()
    with cp.cuda.Device(device):
        stream = _stream_after([work], device)
        host = staging.to_host(work.inputs.inputs, stream)
        stream.synchronize()

    def done(result: Any) -> None:
        with cp.cuda.Device(device):
            work.done(_on_device(result, work, stream))

    return Work(work.request, host, work.process_set, done, stream)


# ----------------------------------------------------------------------------- NCCL runners

def _nccl_allreduces(st: World, items: List[Tuple[int, Work, Any, int]],
                     trace: Optional[Callable[[List[int], Phases, Dict[str, Any]], None]]) -> None:
    tensors = [(k, i) for k, (_, work, _, _) in enumerate(items)
               for i in range(len(work.inputs.inputs))]
    keys, sizes = [], []
    for k, i in tensors:
        _, work, _, device = items[k]
        a = work.inputs.inputs[i]
        r = work.request
        keys.append((id(work.process_set), device, r.op, r.scale, a.dtype))
        sizes.append(a.nbytes)
    outs: List[List[Any]] = [[None] * len(w.inputs.inputs) for _, w, _, _ in items]
    streams: List[Any] = [None] * len(items)  # where each work's last bucket ran
    cp = gpu.cupy()
    buckets = ([[0]] if len(tensors) == 1
               else fusion.plan_buckets(keys, sizes, st.settings.fusion_threshold))
    for number, bucket in enumerate(buckets):
        members = [tensors[b] for b in bucket]
        _, first, comm, device = items[members[0][0]]
        start = time.perf_counter()
        ks = sorted({k for k, _ in members})
        stream = _stream_after([items[k][1] for k in ks], device)
        reduced = _run_on(cp, device, stream, _allreduce_bucket, cp, comm, stream,
                          first.request, device,
                          [items[k][1].inputs.inputs[i] for k, i in members])
        for (k, i), r in zip(members, reduced):
            outs[k][i] = r
        for k in ks:
            if streams[k] is not None and streams[k] is not stream:
                stream.wait_event(streams[k].record())  # the work's earlier buckets too
            streams[k] = stream
        if trace is not None:
            trace(sorted({items[k][0] for k, _ in members}),
                  [("NCCL_ALLREDUCE", start, time.perf_counter())],
                  {"bucket": number, "tensors": len(members),
                   "bytes": int(sum(sizes[b] for b in bucket))})
    for (_, work, _, device), out, stream in zip(items, outs, streams):
        work.done(_run_on(cp, device, stream, _finished,
                          out if work.request.kind == Kind.GROUPED_ALLREDUCE else out[0],
                          work, stream))


def _run_on(cp: Any, device: int, stream: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with ``device`` and ``stream`` current, switching only where they are not
    already (a blocking call's round usually runs on the caller's thread, on its stream)."""
    if cp.cuda.runtime.getDevice() == device and cp.cuda.get_current_stream().ptr == stream.ptr:
        return fn(*args)
    with cp.cuda.Device(device), stream:
        return fn(*args)


def _allreduce_bucket(cp: Any, comm: Any, stream: Any, request: Request, device: int,
                      arrays: List[Any]) -> List[Any]:
    """All-reduce CuPy arrays of one dtype, op and factors; returns new arrays."""
    dtype = arrays[0].dtype
    work = nccl_transport.reduce_dtype(dtype)
    op = request.reduce_op()
    prescale, postscale = request.scale
    wire = dtypes.bool_op(op) if dtype.kind == "b" else op
    native_average = op == ReduceOp.AVERAGE and postscale == 1.0 and work.kind == "f"
    scale = None if native_average else scaler(op, postscale, comm.size,
                                               half(dtype, work))
    if len(arrays) == 1 and work.itemsize == dtype.itemsize and prescale == 1.0:
        a = arrays[0]
        out = cp.empty(a.shape, work)
        comm.allreduce(a if work == dtype else a.view(work), out, wire, stream, native_average)
        if scale is not None:
            scale(out)
        return [out.astype(dtype, copy=False)]
    size = sum(a.size for a in arrays)
    buf = _fusion_buffer(cp, device, work, size)
    fusion.pack([a.view(work) if dtype.kind == "b" else a for a in arrays], buf, prescale)
    comm.allreduce(buf, buf, wire, stream, native_average)
    if scale is not None:
        scale(buf)
    out, offset = [], 0
    for a in arrays:
        out.append(buf[offset:offset + a.size].reshape(a.shape).astype(dtype, copy=True))
        offset += a.size
    return out


def _fusion_buffer(cp: Any, device: int, dtype: np.dtype, size: int) -> Any:
    buf = _fusion_buffers.get((device, dtype))
    if buf is None or buf.size < size:
        buf = _fusion_buffers[(device, dtype)] = cp.empty(size, dtype)
    return buf[:size]


def _bytes(a: Any) -> Any:
    return a.reshape(-1).view(np.uint8)


def _allgather(st: World, work: Work, comm: Any, stream: Any) -> Any:
    cp = gpu.cupy()
    arrays = work.inputs.inputs
    rows = st.transport.allgather_ints(work.process_set.group.comm,
                                       np.array([a.shape[0] for a in arrays], np.int64))
    outs = []
    for i, a in enumerate(arrays):
        counts = rows[:, i] * row_bytes(a)
        out = cp.empty((int(rows[:, i].sum()),) + a.shape[1:], a.dtype)
        most = int(counts.max())
        if most and (counts == most).all():
            comm.allgather(_bytes(a), _bytes(out), stream)
        elif most:  # ragged: every rank sends a block padded to the largest
            send = cp.zeros(most, np.uint8)
            send[:a.nbytes] = _bytes(a)
            recv = cp.empty(most * comm.size, np.uint8)
            comm.allgather(send, recv, stream)
            flat, offset = _bytes(out), 0
            for r, n in enumerate(counts.tolist()):
                flat[offset:offset + n] = recv[r * most:r * most + n]
                offset += n
        outs.append(out)
    return outs[0] if work.request.kind == Kind.ALLGATHER else outs


def _broadcast(st: World, work: Work, comm: Any, stream: Any) -> Any:
    (a,) = work.inputs.inputs
    ps = work.process_set
    root = ps.ranks.index(work.request.root_rank())
    out = gpu.cupy().empty_like(a)
    if root == comm.rank:
        out[...] = a
    comm.broadcast(_bytes(out), root, stream)
    return out


def _alltoall(st: World, work: Work, comm: Any, stream: Any) -> Tuple[Any, np.ndarray]:
    a, send_splits = work.inputs.inputs
    recv_splits = st.transport.alltoall_ints(work.process_set.group.comm, send_splits)
    out = gpu.cupy().empty((int(recv_splits.sum()),) + a.shape[1:], a.dtype)
    row = row_bytes(a)
    comm.alltoallv(_bytes(a), send_splits * row, _bytes(out), recv_splits * row, stream)
    return out, recv_splits


def _reducescatter(st: World, work: Work, comm: Any, stream: Any) -> Any:
    """Each array: rank r's rows go to block r of a buffer padded to the largest block, NCCL
    reduce-scatters the blocks, each rank keeps the rows of its own."""
    cp = gpu.cupy()
    request, n, me = work.request, comm.size, comm.rank
    op = request.reduce_op()
    prescale, postscale = request.scale
    outs = []
    for a in work.inputs.inputs:
        dtype, wdtype = a.dtype, nccl_transport.reduce_dtype(a.dtype)
        rows = scatter_rows(a.shape[0], n)
        row_elems = int(np.prod(a.shape[1:], dtype=np.int64))
        block = int(rows.max()) * row_elems
        send = cp.zeros(block * n, wdtype)
        starts = np.concatenate(([0], np.cumsum(rows)))
        src = a.view(wdtype) if dtype.kind == "b" else a
        for r in range(n):
            part = src[starts[r]:starts[r + 1]]
            fusion.pack([part], send[r * block:r * block + part.size], prescale)
        recv = cp.empty(block, wdtype)
        if block:
            comm.reduce_scatter(send, recv, dtypes.bool_op(op) if dtype.kind == "b" else op,
                                stream)
        mine = recv[:int(rows[me]) * row_elems]
        scale_in_place(mine, op, postscale, n, half(dtype, wdtype))
        outs.append(mine.reshape((int(rows[me]),) + a.shape[1:]).astype(dtype, copy=True))
    return outs[0] if request.kind == Kind.REDUCESCATTER else outs


_NCCL_RUNNERS: Dict[Kind, Callable[[Any, Work, Any, Any], Any]] = {
    Kind.ALLGATHER: _allgather, Kind.GROUPED_ALLGATHER: _allgather, Kind.BROADCAST: _broadcast,
    Kind.ALLTOALL: _alltoall, Kind.REDUCESCATTER: _reducescatter,
    Kind.GROUPED_REDUCESCATTER: _reducescatter,
}
