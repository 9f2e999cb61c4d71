"""one-off: the single-copy all-reduce with pinned vs pageable inputs/outputs (np=2)"""
import statistics, sys, time
import numpy as np
import hvdlike as hvd
from hvdlike import buffers
from hvdlike.reduce_ops import ReduceOp
hvd.init()
from mpi4py import MPI
ps = hvd.global_process_set
try:
    import cupyx
    def pinned(n): return cupyx.empty_pinned((n,), np.float32)
except ImportError:
    def pinned(n): return np.empty(n, np.float32)
def pageable(n): return buffers._aligned_empty((n,), np.float32, 4 * n)
comm = ps._comm
rows = []
for mib in (16, 64):
    n = mib << 18
    arrs = {k: f(n) for k, f in (("pg_in", pageable), ("pg_out", pageable), ("pin_in", pinned), ("pin_out", pinned))}
    for a in arrs.values():
        a[:] = hvd.rank() + 1
    variants = [(i, o, r) for r in ("cma",) for i in ("pg", "pin") for o in ("pg", "pin")]
    times = {v: [] for v in variants}
    for rep in range(8):
        for v in variants:
            i, o, r = v
            red = ps._cma if r == "cma" else ps._shm
            if red is None:
                continue
            comm.Barrier()
            t = time.perf_counter()
            red.allreduce_many([arrs[i + "_in"]], [arrs[o + "_out"]], ReduceOp.SUM, None)
            dt = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
            assert arrs[o + "_out"][0] == 3.0 and arrs[o + "_out"][-1] == 3.0
            if rep:
                times[v].append(dt)
    for v, ts in times.items():
        if ts:
            rows.append((mib, *v, statistics.median(ts) * 1e3, min(ts) * 1e3))
if hvd.rank() == 0:
    print(f"{'MiB':>4} {'in':>4} {'out':>4} {'reducer':>7} {'median ms':>10} {'min ms':>8}")
    for r in rows:
        print(f"{r[0]:>4} {r[1]:>4} {r[2]:>4} {r[3]:>7} {r[4]:>10.2f} {r[5]:>8.2f}")
