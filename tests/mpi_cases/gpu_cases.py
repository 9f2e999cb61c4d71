"""GPU runs of the collective cases (collective_cases.py) and GPU-specific checks.

``run(kind)`` runs every case with its inputs moved to the GPU as CuPy arrays ("cupy") or
PyTorch CUDA tensors ("torch"), and returns {case id: result back on the host} plus which
transport served the set and the kinds of array that came back, for the pytest side to check
against NumPy.
"""
from typing import Any, Dict

import numpy as np

import cupy as cp
import hvdlike as hvd
from hvdlike.engine import execute_gpu
from collective_cases import cases, run_case

import collective_cases


def _to_gpu(x: Any, kind: str) -> Any:
    if isinstance(x, list):
        return [_to_gpu(v, kind) for v in x]
    a = cp.asarray(x)
    if kind == "torch":
        import torch

        return torch.from_dlpack(a)
    return a


def _to_host(x: Any, kinds: set) -> Any:
    if isinstance(x, list):
        return [_to_host(v, kinds) for v in x]
    if isinstance(x, tuple):
        return tuple(_to_host(v, kinds) for v in x)
    if isinstance(x, np.ndarray):  # alltoall's received splits stay on the host
        return x
    kinds.add(type(x).__module__.split(".")[0])
    return cp.asnumpy(cp.from_dlpack(x)) if not isinstance(x, cp.ndarray) else cp.asnumpy(x)


def run(kind: str = "cupy") -> Dict[str, Any]:
    hvd.init()
    hvd.pin_gpu()
    on_host = collective_cases.inputs
    collective_cases.inputs = lambda case, rank, size: _to_gpu(on_host(case, rank, size), kind)
    kinds: set = set()
    try:
        results = {c.id: _to_host(run_case(c, hvd.global_process_set), kinds) for c in cases()}
    finally:
        collective_cases.inputs = on_host
    transport = execute_gpu._transports.get(0)
    return {"results": results, "kinds": sorted(kinds),
            "transport": transport if isinstance(transport, str) else type(transport).__name__}


def _error(fn: Any) -> str:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test compares what every rank raised
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def errors() -> Dict[str, str]:
    """Bad GPU input: mixed host/GPU arrays, GPU on one rank and host on another, Adasum."""
    hvd.init()
    hvd.pin_gpu()
    out = {"mixed": _error(lambda: hvd.grouped_allreduce([cp.ones(3), np.ones(3)], name="m"))}
    x = cp.ones(3, cp.float32) if hvd.rank() == 0 else np.ones(3, np.float32)
    out["device mismatch"] = _error(lambda: hvd.allreduce(x, name="d"))
    out["adasum"] = _error(lambda: hvd.allreduce(cp.ones(3), op=hvd.Adasum, name="a"))
    out["after"] = cp.asnumpy(hvd.allreduce(cp.full(2, hvd.rank(), cp.float32), op=hvd.Sum,
                                            name="after")).tolist()
    return out


def forced_nccl() -> str:
    """HVDLIKE_GPU_TRANSPORT=nccl where NCCL cannot serve (ranks share one GPU)."""
    hvd.init()
    hvd.pin_gpu()
    return _error(lambda: hvd.allreduce(cp.ones(4), name="forced"))


def streams(n: int = 1 << 24) -> Dict[str, Any]:
    """Results follow the caller's stream: the input is made by a long chain of kernels on a
    stream of the caller's, submitted at once; the result is read on that stream."""
    hvd.init()
    hvd.pin_gpu()
    s = cp.cuda.Stream(non_blocking=True)
    checks = []
    with s:
        for step in range(3):
            x = cp.zeros(n, cp.float32)
            for _ in range(20):  # long enough that the engine would see zeros if it did not wait
                x += 1.0
            x *= hvd.rank() + 1 + step
            handle = hvd.allreduce_async(x, op=hvd.Sum, name=f"stream.{step}")
            y = handle.synchronize()
            total = float(y[:1024].sum()) / 1024  # runs on s, after the collective
            checks.append(total)
    ranks = hvd.size()
    want = [20.0 * sum(r + 1 + step for r in range(ranks)) for step in range(3)]
    return {"got": checks, "want": want}


def join_and_fuse() -> Dict[str, Any]:
    """A joined rank serves GPU all-reduces with zeros; fused steps reuse the fusion buffer."""
    hvd.init()
    hvd.pin_gpu()
    steps = []
    for step in range(3):
        xs = [cp.full((i + 1, 3), hvd.rank() + step + i, cp.float32) for i in range(4)]
        steps.append([cp.asnumpy(y).tolist() for y in
                      hvd.grouped_allreduce(xs, op=hvd.Sum, name=f"fused.{step}")])
    joined = None
    if hvd.rank() == 0:
        joined = cp.asnumpy(hvd.allreduce(cp.full(5, 7.0, cp.float32), op=hvd.Sum,
                                          name="while joined")).tolist()
    last = hvd.join()
    return {"steps": steps, "joined": joined, "last": last, "size": hvd.size()}
