#!/usr/bin/env python
"""The on-node all-reduce transports side by side, in one run: raw ``MPI_Allreduce``, the
shared-memory window (hvdlike/transport/shm.py) and single-copy through cross-memory attach
(hvdlike/transport/cma.py), called directly (no engine), float32 sum.

Run under MPI on one node::

    hvdlikerun -np 2 python scripts/bench_on_node.py [--sizes 256KiB,1MiB,...] [--rounds 15]
        [--out results/bench_on_node] [--no-plot]

Per size: each transport's result is checked once against NumPy on every rank (a wrong one
exits non-zero), then ``--rounds`` rounds time every transport once, in an order that rotates
from round to round. A timed call is started together (barrier first) and runs ``iters``
times; its time is the slowest rank's mean per call. Reported: the median over rounds, and
raw MPI's time over each transport's (above 1: faster than MPI). This is what
``HVDLIKE_CMA_THRESHOLD`` (the size from which the engine takes single copy over the window)
is chosen from. Rank 0 prints a table and writes OUT.json and OUT.png.
"""
import argparse
import datetime
import os
import socket
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

import numpy as np
from mpi4py import MPI

import hvdlike as hvd
from hvdlike.base.reduce_ops import ReduceOp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_allreduce import human, parse_sizes  # noqa: E402
from bench_output import figure, markdown_table, write_json  # noqa: E402

TRANSPORTS = ("mpi", "window", "single_copy")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="64KiB,256KiB,1MiB,4MiB,16MiB,64MiB",
                   help="comma-separated sizes in bytes (default %(default)s)")
    p.add_argument("--rounds", type=int, default=15, help="timed rounds per size")
    p.add_argument("--out", default="results/bench_on_node", help="writes OUT.json, OUT.png")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    return p.parse_args(argv)


def calls(comm: MPI.Comm, x: np.ndarray, out: np.ndarray) -> Dict[str, Callable[[], None]]:
    ps = hvd.global_process_set
    window, single = ps.group.reducers.get("shm"), ps.group.reducers.get("cma")
    if window is None or single is None or window.across is not None:
        raise SystemExit("bench_on_node: needs 2+ ranks on one node, the shared-memory window "
                         "and cross-memory attach (HVDLIKE_CMA=1, HVDLIKE_SHM_BUFFER > 0)")
    if not window.reserve(x.nbytes):
        raise SystemExit("bench_on_node: /dev/shm has no room for the window")
    return {"mpi": lambda: comm.Allreduce(x, out, MPI.SUM),
            "window": lambda: window.allreduce_many([x], [out], ReduceOp.SUM),
            "single_copy": lambda: single.allreduce_many([x], [out], ReduceOp.SUM)}


def timed(comm: MPI.Comm, fn: Callable[[], None], iters: int) -> float:
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    mine = (time.perf_counter() - start) / iters
    return comm.allreduce(mine, op=MPI.MAX)


def bench_size(comm: MPI.Comm, nbytes: int, rounds: int) -> Dict:
    n = nbytes // 4
    rank, size = comm.Get_rank(), comm.Get_size()
    x = (np.arange(n, dtype=np.float32) % 97) * (rank + 1)
    out = np.empty_like(x)
    want = (np.arange(n, dtype=np.float32) % 97) * (size * (size + 1) // 2)
    fns = calls(comm, x, out)
    for name, fn in fns.items():  # right, on every rank, before any timing
        out[:] = 0
        fn()
        ok = comm.allreduce(int(np.array_equal(out, want)), op=MPI.MIN)
        if not ok:
            raise SystemExit(f"bench_on_node: {name} gave a wrong sum at {human(nbytes)}")
    iters = max(1, min(200, (8 << 20) // max(nbytes, 1)))
    times: Dict[str, List[float]] = {t: [] for t in TRANSPORTS}
    for _ in range(2):  # warm-up
        for t in TRANSPORTS:
            timed(comm, fns[t], iters)
    for r in range(rounds):
        for k in range(len(TRANSPORTS)):
            t = TRANSPORTS[(r + k) % len(TRANSPORTS)]
            times[t].append(timed(comm, fns[t], iters))
    median = {t: statistics.median(v) for t, v in times.items()}
    return {"bytes": nbytes, "iters": iters, "median_s": median,
            "mpi_over": {t: median["mpi"] / median[t] for t in TRANSPORTS},
            "fastest": min(median, key=median.get), "all_s": times}


def table(rows: List[Dict]) -> str:
    cells = []
    for row in rows:
        m, o = row["median_s"], row["mpi_over"]
        cells.append([human(row["bytes"]), f"{m['mpi'] * 1e6:.0f} us",
                      f"{m['window'] * 1e6:.0f} us", f"{m['single_copy'] * 1e6:.0f} us",
                      f"{o['window']:.2f}", f"{o['single_copy']:.2f}", row["fastest"]])
    return markdown_table(["size", "MPI", "window", "single copy", "MPI / window",
                           "MPI / single copy", "fastest"], cells)


def plot(rows: List[Dict], path: str, title: str) -> None:
    with figure(path, figsize=(7, 4), dpi=100) as (fig, ax):
        xs = [row["bytes"] for row in rows]
        for t in TRANSPORTS:
            ax.plot(xs, [row["median_s"][t] * 1e6 for row in rows], marker="o", label=t)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes (float32 sum)")
        ax.set_ylabel("time per call, µs (median; slowest rank)")
        ax.set_title(title)
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    hvd.init()
    comm = MPI.COMM_WORLD
    rows = [bench_size(comm, nbytes, args.rounds) for nbytes in parse_sizes(args.sizes)]
    if comm.Get_rank() == 0:
        text = table(rows)
        print(text, flush=True)
        meta = {"np": comm.Get_size(), "host": socket.gethostname(), "cpu_count": os.cpu_count(),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "mpi": MPI.Get_library_version().splitlines()[0].strip("\x00 "),
                "rounds": args.rounds, "argv": sys.argv}
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        write_json(args.out + ".json",
                   {"metadata": meta, "results": rows, "table_markdown": text})
        if not args.no_plot:
            plot(rows, args.out + ".png", f"on-node all-reduce, np={comm.Get_size()}")
        print(f"wrote {args.out}.json", flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
