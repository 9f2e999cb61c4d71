#!/usr/bin/env python
"""GPU all-reduce benchmark: hvdlike on GPU arrays against raw CuPy NCCL and its own bounds.

Run under MPI on a GPU machine (scripts/gpu_check.sh does both)::

    hvdlikerun -np 1 python scripts/bench_gpu.py [--sizes 1MiB,...] [--out results/bench_gpu]
    hvdlikerun -np 2 python scripts/bench_gpu.py ...

np=1 (NCCL on a one-rank communicator: an all-reduce there is a device-to-device copy, so
this measures hvdlike's per-call cost on top of NCCL, not a network), per float32 size:

* raw:     ``NcclCommunicator.allReduce`` from a preallocated buffer into another, on a stream;
* hvdlike: ``hvd.allreduce(x, op=hvd.Sum)`` on a CuPy array (a new result array each call);
* copy:    ``cupy.copyto`` of the same bytes (what the NCCL call amounts to here).

Each series is a batch of calls issued back to back, then one device synchronization; the time
per call is the batch's wall time / calls (at least 20 calls at np=1, so that it measures the
steady state, where the GPU's work hides the host's per-call cost once it is longer), median
over batches, series interleaved. Ratio =
raw time / hvdlike time (target >= 0.95 at >= 16 MiB).

np=2 on one GPU (NCCL refuses two ranks on one GPU, so hvdlike stages through host memory):

* staged:  ``hvd.allreduce(x, op=hvd.Sum)`` on a CuPy array, device synchronized after;
* bound:   the sum of its parts timed alone: device->pinned host copy, hvdlike's host
  all-reduce of the same bytes, host->device copy;
* naive:   what one would write by hand: ``cupy.asnumpy``, ``comm.Allreduce``, ``cupy.asarray``.

Ratio = bound / staged time (1.0: staging costs nothing beyond its copies). Times are the
slowest rank's. Rank 0 prints a table and writes OUT_np<N>.json and OUT_np<N>.png.
"""
import argparse
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List

import numpy as np
from mpi4py import MPI

import cupy as cp
import hvdlike as hvd
from bench_output import figure, write_json

MIB = 1 << 20


def parse_sizes(text: str) -> List[int]:
    sizes = []
    for part in text.split(","):
        part = part.strip()
        unit = {"KiB": 1 << 10, "MiB": MIB, "GiB": 1 << 30}.get(part[-3:], 1)
        sizes.append(int(part[:-3] if unit != 1 else part) * unit)
    return sizes


def timed(comm: MPI.Comm, fn: Callable[[], object], calls: int) -> float:
    """Seconds per call of ``calls`` back-to-back calls ended by a device synchronization,
    the slowest rank's."""
    cp.cuda.Device().synchronize()
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    cp.cuda.Device().synchronize()
    return comm.allreduce((time.perf_counter() - start) / calls, op=MPI.MAX)


def series_np1(nbytes: int) -> Dict[str, Callable[[], object]]:
    from cupy.cuda import nccl

    n = nbytes // 4
    x, recv, dst = cp.ones(n, cp.float32), cp.empty(n, cp.float32), cp.empty(n, cp.float32)
    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    stream = cp.cuda.get_current_stream()

    def raw() -> None:
        comm.allReduce(x.data.ptr, recv.data.ptr, n, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                       stream.ptr)

    return {"raw": raw, "hvdlike": lambda: hvd.allreduce(x, op=hvd.Sum, name="bench"),
            "copy": lambda: cp.copyto(dst, x)}


def series_np2(nbytes: int, comm: MPI.Comm) -> Dict[str, Callable[[], object]]:
    import cupyx

    n = nbytes // 4
    x = cp.ones(n, cp.float32)
    pinned = cupyx.empty_pinned(n, np.float32)
    host = np.ones(n, np.float32)
    back = cp.empty(n, cp.float32)

    def naive() -> None:
        h = cp.asnumpy(x)
        out = np.empty_like(h)
        comm.Allreduce(h, out, MPI.SUM)
        cp.asarray(out)

    return {"staged": lambda: hvd.allreduce(x, op=hvd.Sum, name="bench"),
            "d2h": lambda: x.get(out=pinned),
            "host": lambda: hvd.allreduce(host, op=hvd.Sum, name="bench.host"),
            "h2d": lambda: back.set(pinned),
            "naive": naive}


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1MiB,4MiB,16MiB,64MiB,256MiB")
    p.add_argument("--batches", type=int, default=7)
    p.add_argument("--out", default="results/bench_gpu")
    args = p.parse_args(argv)
    hvd.init()
    hvd.pin_gpu()
    comm, n = MPI.COMM_WORLD, hvd.size()
    if n > 2:
        raise SystemExit("bench_gpu.py runs at np=1 (NCCL) or np=2 (staged on one GPU)")
    rows = []
    for nbytes in parse_sizes(args.sizes):
        series = series_np1(nbytes) if n == 1 else series_np2(nbytes, comm)
        # np=1: enough calls that the first one's host-side latency (before the GPU has work)
        # does not count as the steady state's cost; np=2 is host-bound, a few calls suffice
        calls = max(20, min(200, (4 << 30) // nbytes)) if n == 1 else \
            max(3, min(100, (1 << 30) // nbytes))
        for fn in series.values():  # warm-up: communicators, pools, pinned buffers
            timed(comm, fn, 2)
        samples: Dict[str, List[float]] = {k: [] for k in series}
        for _ in range(args.batches):
            for name, fn in series.items():
                samples[name].append(timed(comm, fn, calls))
        row = {"bytes": nbytes, "calls": calls,
               **{k: statistics.median(v) for k, v in samples.items()}}
        if n == 1:
            row["ratio"] = row["raw"] / row["hvdlike"]
        else:
            row["bound"] = row["d2h"] + row["host"] + row["h2d"]
            row["ratio"] = row["bound"] / row["staged"]
        rows.append(row)
        del series
    if hvd.rank() == 0:
        report(rows, n, args.out)
    hvd.shutdown()
    return 0


def report(rows: List[Dict], n: int, out: str) -> None:
    device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    cols = ["raw", "hvdlike", "copy"] if n == 1 else ["staged", "bound", "d2h", "host", "h2d",
                                                        "naive"]
    label = "raw/hvdlike" if n == 1 else "bound/staged"
    print(f"\nGPU all-reduce, np={n}, {device}, float32, time per call (us)")
    print(f"{'size':>8} " + " ".join(f"{c:>9}" for c in cols) + f" {label:>12}")
    for r in rows:
        print(f"{r['bytes'] // MIB:>5}MiB " + " ".join(f"{r[c] * 1e6:9.1f}" for c in cols)
              + f" {r['ratio']:12.2f}")
    if n == 1:
        met = all(r["ratio"] >= 0.95 for r in rows if r["bytes"] >= 16 * MIB)
        print(f"target hvdlike >= 0.95x raw NCCL at >= 16 MiB: {'met' if met else 'MISSED'}")
    meta = {"device": device, "np": n, "python": platform.python_version(),
            "cupy": cp.__version__, "nccl": _nccl_version(), "argv": sys.argv}
    write_json(f"{out}_np{n}.json", {"meta": meta, "rows": rows})
    plot(rows, cols, label, f"{out}_np{n}.png", f"np={n}, {device}")
    print(f"wrote {out}_np{n}.json and {out}_np{n}.png")


def _nccl_version() -> int:
    from cupy.cuda import nccl

    return nccl.get_version()


def plot(rows: List[Dict], cols: List[str], label: str, path: str, title: str) -> None:
    sizes = [r["bytes"] / MIB for r in rows]
    with figure(path, 1, 2, figsize=(11, 4)) as (fig, (left, right)):
        for c in cols:
            left.plot(sizes, [r[c] * 1e6 for r in rows], marker="o", label=c)
        left.set(xscale="log", yscale="log", xlabel="MiB", ylabel="us per call", title=title)
        left.legend()
        right.plot(sizes, [r["ratio"] for r in rows], marker="o")
        right.axhline(0.95 if label.startswith("raw") else 1.0, color="grey", linestyle="--")
        right.set(xscale="log", xlabel="MiB", ylabel=label, title=label)


if __name__ == "__main__":
    sys.exit(main())
