"""Ad hoc (not part of hvdlike): can threads inside each rank make a 1 MiB on-node all-reduce
faster? 2 ranks, float32 sum, each call started together after a barrier; raw MPI, hvdlike's
shared-window transport alone, and a threaded variant of the same algorithm (T threads per
rank, each doing all three phases on its own slice; the two ranks' threads of one slice meet
at spin-wait flags in shared memory, no MPI barrier), T = 1, 2, 4, 8."""
import json
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

from hvdlike.reduce_ops import ReduceOp
from hvdlike.transport.shm import SharedMemoryAllreduce

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert size == 2
peer = 1 - rank


class Threaded:
    def __init__(self, n, threads):
        self.n, self.t = n, threads
        flags = 64 * 8 * 2 * threads
        nbytes = 4 * n * 2 + flags  # slot (n) + result (n) per rank, oversized for simplicity
        self.win = MPI.Win.Allocate_shared(nbytes, 1, comm=comm)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.slot, self.res, self.flag = [], [], []
        for r in range(2):
            mem, _ = self.win.Shared_query(r)
            whole = np.frombuffer(mem, np.uint8)
            self.slot.append(whole[:4 * n].view(np.float32))
            self.res.append(whole[4 * n:8 * n].view(np.float32))
            # flag[phase][thread], 64 bytes apart
            self.flag.append(whole[8 * n:8 * n + flags].view(np.int64).reshape(2, threads, 64))
        self.flag[rank][...] = 0
        comm.Barrier()
        half = n // 2
        self.mine = slice(rank * half, (rank + 1) * half if rank == 0 else n)
        self.other = slice(peer * half, (peer + 1) * half if peer == 0 else n)
        self.seq = 0
        self.go = [threading.Event() for _ in range(threads)]
        self.done = [threading.Event() for _ in range(threads)]
        self.x = self.out = None
        self.workers = [threading.Thread(target=self._loop, args=(t,), daemon=True)
                        for t in range(1, threads)]
        for w in self.workers:
            w.start()

    def _part(self, s, t):
        lo, hi = s.start, s.stop
        k = (hi - lo) // self.t
        return slice(lo + t * k, hi if t == self.t - 1 else lo + (t + 1) * k)

    def _wait(self, phase, t, seq):
        f = self.flag[peer]
        while f[phase, t, 0] < seq:
            time.sleep(0)

    def _work(self, t, seq):
        x, out = self.x, self.out
        o, m = self._part(self.other, t), self._part(self.mine, t)
        self.slot[rank][o] = x[o]
        self.flag[rank][0, t, 0] = seq
        self._wait(0, t, seq)
        r = self.res[rank][m]
        np.add(x[m], self.slot[peer][m], out=r)
        out[m] = r
        self.flag[rank][1, t, 0] = seq
        self._wait(1, t, seq)
        out[o] = self.res[peer][o]

    def _loop(self, t):
        while True:
            self.go[t].wait()
            self.go[t].clear()
            self._work(t, self.seq)
            self.done[t].set()

    def allreduce(self, x, out):
        self.seq += 1
        self.x, self.out = x, out
        for t in range(1, self.t):
            self.go[t].set()
        self._work(0, self.seq)
        for t in range(1, self.t):
            self.done[t].wait()
            self.done[t].clear()


def timeit(fn, calls, batches):
    per = []
    for _ in range(batches):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            comm.Barrier()  # started together, as a training step's call is
            fn()
        dt = (time.perf_counter() - t0) / calls
        per.append(comm.allreduce(dt, op=MPI.MAX))
    return float(np.median(per))


def barrier_cost(calls, batches):
    return timeit(lambda: None, calls, batches)


results = {}
for mib in (1, 4):
    n = mib * (1 << 18)
    x = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
    expect = comm.allreduce(x, op=MPI.SUM)
    out = np.empty_like(x)
    shm = SharedMemoryAllreduce(comm, 64 << 20)
    shm.reserve(x.nbytes)
    variants = {"raw": lambda: comm.Allreduce(x, out, MPI.SUM),
                "shm": lambda: shm.allreduce(x, out, ReduceOp.SUM)}
    threaded = {t: Threaded(n, t) for t in (1, 2, 4, 8)}
    for t, th in threaded.items():
        variants[f"threads{t}"] = (lambda th=th: th.allreduce(x, out))
    for name, fn in variants.items():
        out[...] = 0
        fn()
        assert np.allclose(out, expect, rtol=1e-5), name
    calls = 50 if mib == 1 else 20
    base = barrier_cost(calls, 5)
    row = {}
    for rep in range(3):  # rounds, variants interleaved
        for name, fn in variants.items():
            row.setdefault(name, []).append(timeit(fn, calls, 7) - base)
    med = {k: float(np.median(v)) * 1e6 for k, v in row.items()}
    results[f"{mib}MiB"] = med
    if rank == 0:
        print(f"{mib} MiB (us per call, barrier {base * 1e6:.1f} us subtracted): " +
              "  ".join(f"{k} {v:.0f}" for k, v in med.items()) +
              "  | raw/x: " + "  ".join(f"{k} {med['raw'] / v:.2f}" for k, v in med.items()),
              flush=True)
if rank == 0 and len(sys.argv) > 1:
    json.dump(results, open(sys.argv[1], "w"), indent=1)
MPI.COMM_WORLD.Barrier()
import os
os._exit(0)
