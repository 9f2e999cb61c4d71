#!/usr/bin/env python
"""Does this MPI hang when two threads of a rank use MPI at once? (root only, for the cluster)

    python scripts/repro_ompi_threads.py [--runs 5] [--iterations 300] [--timeout 90] [--load 0]

mpi4py alone, no hvdlike: the main thread loops over ``Barrier``, a 1 MiB ``Allreduce`` and a
``Barrier`` on COMM_WORLD; with ``--ticker``, a second thread meanwhile runs a persistent
``MPI_Allgather`` of a 64-byte row on a duplicate of COMM_WORLD every 1-10 ms, which is what
hvdlike's engine does to keep its peers company. Each layout runs ``--runs`` jobs, each with a
hard timeout; a job that does not end in time counts as hung. Layouts: 2 test hosts x 2 ranks
(TCP between the hosts) with and without the ticker, and 1 host x 4 ranks with it. ``--load N``
keeps N busy-looping processes running meanwhile, as a busier machine would. Prints a table
and writes results/repro_ompi_threads.json. See docs/multinode.md.
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]


def rank_main(iterations: int, ticker: bool) -> None:
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    done = threading.Event()
    if ticker:
        ctrl = comm.Dup()
        row = np.zeros(8, np.int64)
        rows = np.zeros((comm.Get_size(), 8), np.int64)
        request = ctrl.Allgather_init(row, rows)

        def tick() -> None:
            rounds = 0
            while True:
                row[0], row[1] = rounds, done.is_set()
                request.Start()
                while not request.Test():
                    time.sleep(50e-6)
                if (rows[:, 0] != rounds).any():  # rows of different rounds: MPI mixed them
                    print(f"round {rounds}: rows {rows[:, 0]}", file=sys.stderr, flush=True)
                    os._exit(3)
                if rows[:, 1].all():  # every rank has finished its loop
                    return
                rounds += 1
                time.sleep(0.01 if rounds % 3 == 0 else 0.001)

        thread = threading.Thread(target=tick)
        thread.start()
    x = np.full(1 << 18, comm.Get_rank() + 1, np.float32)
    y = np.empty_like(x)
    for _ in range(iterations):
        comm.Barrier()
        comm.Allreduce(x, y, MPI.SUM)
        comm.Barrier()
    done.set()
    if ticker:
        thread.join()


def run_layout(name: str, cluster: Any, slots: List[int], ticker: bool,
               args: argparse.Namespace) -> Dict[str, Any]:
    mpirun = str(Path(sys.executable).parent / "mpirun")
    program = [sys.executable, str(Path(__file__).resolve()), "--rank", str(args.iterations)]
    program += ["--ticker"] if ticker else []
    if cluster is None:  # one host: this machine
        argv = [mpirun, "-np", str(sum(slots)), "--oversubscribe", "--bind-to", "none",
                "--mca", "mpi_yield_when_idle", "1", *program]
    else:
        argv = cluster.command_on(0, cluster.mpirun_argv(mpirun, slots, program))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_osc="^ucx")
    hung, failed, seconds = 0, 0, []
    for _ in range(args.runs):
        started = time.time()
        try:
            p = subprocess.run(argv, env=env, capture_output=True, text=True,
                               timeout=args.timeout)
            failed += p.returncode != 0
            seconds.append(round(time.time() - started, 1))
        except subprocess.TimeoutExpired:
            hung += 1
            subprocess.run(["pkill", "-9", "-f", "repro_ompi_threads.py --rank"])
    row = {"layout": name, "ticker": ticker, "runs": args.runs, "hung": hung,
           "failed": failed, "seconds_of_finished_runs": seconds}
    print(f"| {name} | {'yes' if ticker else 'no'} | {args.runs} | {hung} | {failed} | "
          f"{', '.join(f'{s:g}' for s in seconds)} |", flush=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--timeout", type=float, default=90, help="seconds before a job counts as hung")
    p.add_argument("--load", type=int, default=0, help="busy-looping processes meanwhile")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--ticker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=str(REPO / "results" / "repro_ompi_threads.json"))
    args = p.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.ticker)
        return 0
    sys.path.insert(0, str(REPO))
    from hvdlike.testing.cluster import Cluster, missing_requirements
    why = missing_requirements()
    if why:
        print(f"this needs the test cluster: {why}", file=sys.stderr)
        return 2
    print(f"{args.load} busy processes meanwhile")
    print("| layout | ticker thread | runs | hung | failed | seconds of the runs that ended |")
    print("|---|---|---|---|---|---|")
    rows = []
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.load)]
    try:
        with Cluster(hosts=2, link="1gbit", prefix="hvdrt") as cluster:
            rows.append(run_layout("2 hosts x 2, 1 Gbit/s", cluster, [2, 2], True, args))
            rows.append(run_layout("2 hosts x 2, 1 Gbit/s", cluster, [2, 2], False, args))
        rows.append(run_layout("1 host x 4", None, [4], True, args))
    finally:
        for busy in load:
            busy.kill()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "load": args.load,
                                          "date": time.strftime("%Y-%m-%d"), "rows": rows},
                                         indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
