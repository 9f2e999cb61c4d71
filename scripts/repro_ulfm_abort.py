#!/usr/bin/env python
"""Does Open MPI's prterun hang when every rank calls MPI_Abort under ULFM?

    python scripts/repro_ulfm_abort.py [--runs 10] [--np 2] [--gap-ms 0 20] [--timeout 10]

mpi4py alone, no hvdlike: each job runs ``mpirun --with-ft ulfm -np N`` with ranks that pass
a barrier, wait ``rank * gap`` ms and call ``MPI_Abort`` (as when every rank raises the same
error), and, for comparison, ranks that exit with status 1 instead. A job still running after
``--timeout`` seconds is killed with SIGKILL (prterun ignores SIGTERM when it hangs) and counts
as hung. Prints a table and writes results/repro_ulfm_abort.json. See docs/reliability.md.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]


def rank_main(how: str, gap_ms: float) -> None:
    import time

    from mpi4py import MPI

    world = MPI.COMM_WORLD
    world.Barrier()
    time.sleep(world.rank * gap_ms / 1000)
    if how == "abort":
        world.Abort(1)
    os._exit(1)


def hung_jobs(how: str, gap_ms: float, np_: int, runs: int, timeout: float) -> int:
    mpirun = str(Path(sys.executable).parent / "mpirun")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [mpirun, "--with-ft", "ulfm", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1",
           "-np", str(np_), sys.executable, __file__, "--rank", how, str(gap_ms)]
    hung = 0
    for _ in range(runs):
        try:
            subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=timeout)  # SIGKILL on timeout
        except subprocess.TimeoutExpired:
            hung += 1
    return hung


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--rank":
        rank_main(sys.argv[2], float(sys.argv[3]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--gap-ms", type=float, nargs="+", default=[0.0, 20.0])
    parser.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args()
    rows: List[Dict[str, object]] = []
    for how in ("abort", "exit 1"):
        for gap in args.gap_ms:
            hung = hung_jobs(how.split()[0], gap, args.np, args.runs, args.timeout)
            rows.append({"ranks": how, "gap_ms": gap, "np": args.np, "runs": args.runs,
                         "hung": hung})
            print(f"{how:8s} gap {gap:5.1f} ms  np={args.np}: {hung} of {args.runs} jobs hung",
                  flush=True)
    out = REPO / "results" / "repro_ulfm_abort.json"
    out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
