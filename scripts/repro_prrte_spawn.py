#!/usr/bin/env python
"""Does Open MPI's launcher fail when ULFM survivors on two hosts spawn a replacement?

    python scripts/repro_prrte_spawn.py [--runs 60] [--timeout 30]   # as root

mpi4py alone, no hvdlike. Each job runs ``mpirun --with-ft ulfm`` with 2 ranks on each of two
test hosts (``hvdlike.testing.cluster``: network namespaces on this machine). The ranks
all-reduce a few times; rank 3 (second host) then kills itself with SIGKILL. The survivors
see the failure, revoke and shrink the world, spawn one new process (``MPI_Comm_spawn``),
merge with it and all-reduce once more; all four print ``RESULT`` and finalize. For
comparison the same jobs run with all four ranks on the first host. A job counts as:

- ``ok``: status 0 and four correct results, and prterun said nothing of its own failures;
- ``ok, launcher failed at the end``: status 0 and four correct results, but prterun printed
  one of its own failures (``PMIX_ERROR ... pmix_server_dyn.c``, "A daemon failed to report
  back", "PRTE has lost communication with a remote daemon");
- ``launcher died``: prterun ended on a signal (heap corruption such as ``free(): invalid
  pointer``), or printed one of its failures and the job did not end well;
- ``other``: any other failure, ``hung``: still running after ``--timeout`` s (killed; the
  JSON's example says how many results had been printed by then).

Prints a table and writes results/repro_prrte_spawn.json. See docs/reliability.md.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Sequence

REPO = Path(__file__).resolve().parents[1]
VICTIM, STEPS = 3, 5
LAUNCHER_FAILED = ("pmix_server_dyn.c", "A daemon failed to report back",
                   "PRTE has lost communication with a remote daemon")


def rank_main() -> None:
    """One rank (or the replacement) of the job."""
    from mpi4py import MPI

    parent = MPI.Comm.Get_parent()
    if parent != MPI.COMM_NULL:  # the replacement: join the survivors, last
        world = parent.Merge(high=True)
        parent.Free()
    else:
        world = MPI.COMM_WORLD.Dup()
        world.Set_errhandler(MPI.ERRORS_RETURN)
        try:
            for _ in range(STEPS):
                if world.Get_rank() == VICTIM:
                    os.kill(os.getpid(), signal.SIGKILL)
                world.allreduce(1)
        except MPI.Exception:
            world.Revoke()  # the others may still wait in the all-reduce
        survivors = world.Shrink()
        world.Free()
        info = MPI.Info.Create()
        info.Set("wdir", os.getcwd())
        spawned = survivors.Spawn(sys.executable, [__file__, "--rank"], maxprocs=1, root=0,
                                  info=info)
        info.Free()
        world = spawned.Merge(high=False)
        spawned.Free()
        survivors.Free()
    total = world.allreduce(world.Get_rank())
    print(f"RESULT rank={world.Get_rank()} size={world.Get_size()} sum={total}", flush=True)
    world.Free()
    sys.exit(0)


def outcome(status: int, output: str) -> str:
    results = [line for line in output.splitlines() if line.startswith("RESULT ")]
    said_failed = any(words in output for words in LAUNCHER_FAILED)
    if status == 0 and len(results) == 4 and all("size=4 sum=6" in r for r in results):
        return "ok, launcher failed at the end" if said_failed else "ok"
    if status < 0 or said_failed:
        return "launcher died"
    return "other"


def run_jobs(argv: Sequence[str], env: Dict[str, str], runs: int, timeout: float,
             where: str) -> Dict[str, object]:
    counts = {"ok": 0, "ok, launcher failed at the end": 0, "launcher died": 0, "other": 0,
              "hung": 0}
    examples: Dict[str, str] = {}
    for i in range(runs):
        try:
            p = subprocess.run(argv, env=env, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=timeout)
            kind = outcome(p.returncode, p.stdout)
            if kind != "ok":
                examples.setdefault(kind, f"status {p.returncode}:\n{p.stdout[-1500:]}")
        except subprocess.TimeoutExpired as e:
            kind = "hung"
            out = e.output if isinstance(e.output, str) else (e.output or b"").decode()
            done = sum(line.startswith("RESULT ") for line in out.splitlines())
            examples.setdefault(kind, f"{done} of 4 results printed:\n{out[-1500:]}")
        counts[kind] += 1
        print(f"{where}: run {i + 1}: {kind}", flush=True)
    return {"where": where, "runs": runs, **counts, "examples": examples}


def main() -> None:
    if sys.argv[1:] == ["--rank"]:
        rank_main()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--runs", type=int, default=60, help="jobs per placement")
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    from hvdlike.testing.cluster import Cluster
    mpirun = str(Path(sys.executable).parent / "mpirun")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_osc="^ucx")
    program = [sys.executable, __file__, "--rank"]
    rows: List[Dict[str, object]] = []
    with Cluster(hosts=2, prefix="hvdr", net=81) as cluster:
        for where, slots in (("2 hosts x 2 ranks", [2, 2]), ("1 host x 4 ranks", [4, 0])):
            # the replacement oversubscribes a host (as in hvdlike's elastic tests)
            argv = cluster.command_on(0, cluster.mpirun_argv(mpirun, slots, program,
                                                             ["--with-ft", "ulfm"]))
            rows.append(run_jobs(argv, env, args.runs, args.timeout, where))
    print(f"\n{'where':20s} {'runs':>5s} {'ok':>5s} {'ok, failed at the end':>22s} "
          f"{'launcher died':>14s} {'other':>6s} {'hung':>5s}")
    for r in rows:
        print(f"{r['where']:20s} {r['runs']:5d} {r['ok']:5d} "
              f"{r['ok, launcher failed at the end']:22d} {r['launcher died']:14d} "
              f"{r['other']:6d} {r['hung']:5d}")
    out = REPO / "results" / "repro_prrte_spawn.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
