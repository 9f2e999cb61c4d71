#!/usr/bin/env python
"""The network-bound all-reduce benchmark, on the test cluster (root only)::

    python scripts/bench_cluster.py [--links 1gbit,10gbit,none] [--per-host 1,2] \
        [--max-size 256MiB] [--out results/bench_cluster]

For each link speed (``none``: unshaped veth) it builds 2 test hosts
(hvdlike.testing.cluster), measures the link's TCP line rate with a plain socket stream, and
then, for 1 and 2 ranks per host, runs one MPI job per hvdlike algorithm:

* ``flat`` (HVDLIKE_HIERARCHICAL_ALLREDUCE=0): hvdlike's all-reduce is one MPI_Allreduce;
* ``hierarchical`` (=1; only with 2+ ranks per host): shared memory inside each host, MPI
  across hosts among ranks of equal local rank, shared memory again;
* ``auto``: hvdlike's default, which tries both on the first buckets of each size (those
  calls are not timed) and keeps the faster.

Each job first times raw ``comm.Allreduce`` (mpi4py, preallocated buffers) on the same
sizes, then starts hvdlike and times it, so every ratio compares against a baseline measured
in the same job, seconds apart. Raw MPI runs before ``hvd.init()``, and hvdlike's timing uses
hvdlike's barrier and reduction: no two threads of a rank ever use MPI at once, which Open
MPI 5's TCP transport does not survive reliably (docs/multinode.md). Every call starts
together after a barrier
(as a training step's does); the time is the slowest rank's, the median over the
repetitions. Reported per size: time, algbw (bytes / time), busbw
(algbw x 2(P-1)/P), the ratio to the bandwidth-optimal bound (each host must send
2(H-1)/H of the data over its link: bound = that / measured line rate), the ratio to raw MPI,
and the bytes each host sent over its link per all-reduce (veth counters) against that
two-level minimum. Prints a table, writes OUT.json and OUT.png.
"""
import argparse
import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple
from bench_output import figure

REPO = Path(__file__).resolve().parents[1]
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
PORT = 47211


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*(B|KiB|MiB|GiB)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 64KiB or 256MiB")
    return int(m.group(1)) * UNITS[m.group(2)]


def human(nbytes: float) -> str:
    for unit in ("GiB", "MiB", "KiB"):
        if nbytes >= UNITS[unit]:
            return f"{nbytes / UNITS[unit]:g} {unit}"
    return f"{nbytes:g} B"


# ----------------------------------------------------------------------------- on the ranks

def worker(sizes: List[int], out: str) -> None:
    """Run under mpirun on the test hosts: time raw MPI_Allreduce on every size, then start
    hvdlike and time its all-reduce on the same sizes; read this host's link counter around
    each call. Raw MPI runs before ``hvd.init()`` and hvdlike's timing uses hvdlike's own
    barrier and reduction, so that no two threads of a rank use MPI at the same time: Open
    MPI 5's TCP transport can hang when they do (docs/multinode.md)."""
    import numpy as np
    from mpi4py import MPI

    from hvdlike.testing.cluster import bytes_sent

    dump_after = float(os.environ.get("BENCH_CLUSTER_DUMP_AFTER", "0"))
    if dump_after > 0:  # a hung job shows where every thread of every rank was
        import faulthandler
        faulthandler.dump_traceback_later(dump_after, exit=False)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank = local.Get_rank()
    local.Free()
    counts_bytes = local_rank == 0  # one reader of the counter per host

    def progress(what: str) -> None:  # the driver shows these only if the job hangs or fails
        print(f"rank {rank} on {local_rank}@{os.uname().nodename}: {what}",
              file=sys.stderr, flush=True)

    def sent() -> int:
        return bytes_sent() if counts_bytes else 0

    def series(call: Callable[[int], Any], warm_up: int, barrier: Callable[[], Any],
               maximum: Callable[[np.ndarray], np.ndarray], name: str) -> Dict[int, Any]:
        """Per size: the medians of (slowest rank's seconds, most bytes a host sent) over
        calls that start together after a barrier, as a training step's do."""
        rows = {}
        for nbytes in sizes:
            for _ in range(warm_up):  # connections, windows, buffers (and auto's trials)
                call(nbytes)
            samples = []
            for _ in range(30 if nbytes < (1 << 20) else 10 if nbytes <= (16 << 20) else 5):
                barrier()
                before = sent()
                t0 = time.perf_counter()
                call(nbytes)
                seconds = time.perf_counter() - t0
                barrier()  # every rank is done: all of this call's bytes have left
                link = float(sent() - before) if counts_bytes else -1.0
                samples.append(maximum(np.array([seconds, link])))
            rows[nbytes] = {"time": statistics.median(float(s[0]) for s in samples),
                            "link_bytes": statistics.median(float(s[1]) for s in samples)}
            progress(f"{name} {nbytes} bytes: timed")
        return rows

    held: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}

    def buffers(n: int) -> Tuple[np.ndarray, np.ndarray]:
        """(input, output) of n bytes; only one size's are kept."""
        if n not in held:
            held.clear()
            held[n] = (np.full(n // 4, rank + 1, np.float32), np.empty(n // 4, np.float32))
        return held[n]

    def raw_maximum(a: np.ndarray) -> np.ndarray:
        comm.Allreduce(MPI.IN_PLACE, a, op=MPI.MAX)
        return a

    progress("started")
    raw = series(lambda n: comm.Allreduce(*buffers(n), MPI.SUM), 1, comm.Barrier,
                 raw_maximum, "raw")

    import hvdlike as hvd

    hvd.init()
    progress("hvdlike initialised")
    want = size * (size + 1) / 2
    for n in sizes:
        got = hvd.allreduce(buffers(n)[0], op=hvd.Sum, name=f"check.{n}")
        if not (got[0] == want and got[-1] == want):
            raise SystemExit(f"rank {rank}: wrong all-reduce result at {n} bytes")
    warm_up = 1
    if os.environ.get("HVDLIKE_HIERARCHICAL_ALLREDUCE") == "auto":
        from hvdlike.transport.choice import TRIALS
        warm_up = 2 * TRIALS + 1  # auto's trials of both algorithms, then its choice is timed
    mine = series(lambda n: hvd.allreduce(buffers(n)[0], op=hvd.Sum, name=f"bench.{n}"),
                  warm_up, hvd.barrier,
                  lambda a: hvd.allreduce(a, op=hvd.Max, name="bench.max"), "hvdlike")
    if rank == 0:
        Path(out).write_text(json.dumps([{"bytes": n, "raw": raw[n], "hvdlike": mine[n]}
                                         for n in sizes]))
    hvd.shutdown()


# ----------------------------------------------------------------------------- the driver

def line_rate(cluster: Any, seconds: float = 1.5) -> float:
    """Bytes/s of one TCP stream from host 0 to host 1 (what a single link carries)."""
    server = (
        "import socket,time\n"
        f"s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
        f"s.bind(('{cluster.addresses[1]}',{PORT}));s.listen(1);c,_=s.accept()\n"
        "n=0;t0=None\n"
        "while True:\n"
        "  b=c.recv(1<<20)\n"
        "  if not b: break\n"
        "  if t0 is None: t0=time.perf_counter()\n"
        "  else: n+=len(b)\n"
        "print(n/(time.perf_counter()-t0))\n")
    client = (
        "import socket,time\n"
        f"c=socket.create_connection(('{cluster.addresses[1]}',{PORT}))\n"
        f"buf=bytes(4<<20);end=time.perf_counter()+{seconds}\n"
        "while time.perf_counter()<end: c.sendall(buf)\n"
        "c.close()\n")
    srv = subprocess.Popen(cluster.command_on(1, [sys.executable, "-c", server]),
                           stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    subprocess.run(cluster.command_on(0, [sys.executable, "-c", client]), check=True,
                   timeout=60)
    out, _ = srv.communicate(timeout=60)
    return float(out.strip())


def run_job(cluster: Any, per_host: int, algorithm: str, sizes: List[int],
            tmp: Path, timeout: float) -> List[Dict[str, Any]]:
    mpirun = str(Path(sys.executable).parent / "mpirun")
    out = tmp / f"{per_host}-{algorithm}.json"
    program = [sys.executable, str(Path(__file__).resolve()), "--worker", str(out),
               "--sizes", ",".join(str(s) for s in sizes)]
    names = ["PYTHONPATH", "OMPI_MCA_osc", "HVDLIKE_HIERARCHICAL_ALLREDUCE",
             "HVDLIKE_STALL_CHECK_TIME_SECONDS", "BENCH_CLUSTER_DUMP_AFTER"]
    argv = cluster.command_on(0, cluster.mpirun_argv(
        mpirun, [per_host] * len(cluster.names), program,
        [a for n in names for a in ("-x", n)]))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_osc="^ucx", PYTHONPATH=str(REPO),
               HVDLIKE_HIERARCHICAL_ALLREDUCE={"flat": "0", "hierarchical": "1"}.get(
                   algorithm, algorithm),
               HVDLIKE_STALL_CHECK_TIME_SECONDS="20",  # a stuck hvdlike call names who is late
               BENCH_CLUSTER_DUMP_AFTER=f"{0.8 * timeout:g}")
    try:
        p = subprocess.run(argv, env=env, text=True, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        said = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x
                       for x in (exc.output or "", exc.stderr or ""))
        raise SystemExit(f"the {per_host}-per-host {algorithm} job had not ended after "
                         f"{timeout:g} s; what it printed:\n{said[-6000:]}") from None
    if p.returncode != 0:
        raise SystemExit(f"the {per_host}-per-host {algorithm} job failed:\n"
                         f"{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return json.loads(out.read_text())


def summarize(rows: List[Dict[str, Any]], hosts: int, per_host: int, rate: float,
              meta: Dict[str, Any]) -> List[Dict[str, Any]]:
    ranks = hosts * per_host
    out = []
    for r in rows:
        n = r["bytes"]
        minimum = 2 * (hosts - 1) / hosts * n  # bytes each host must send over its link
        for series in ("raw", "hvdlike"):
            t, link = r[series]["time"], r[series]["link_bytes"]
            out.append(dict(meta, series=series, bytes=n, time_s=t, algbw=n / t,
                            busbw=n / t * 2 * (ranks - 1) / ranks,
                            of_bound=minimum / rate / t, vs_raw=r["raw"]["time"] / t,
                            link_bytes=link, link_vs_minimum=link / minimum))
    return out


def table(results: List[Dict[str, Any]]) -> str:
    lines = ["| link | ranks | algorithm | size | raw MPI | hvdlike | hvdlike / raw | "
             "raw of bound | hvdlike of bound | link bytes / minimum (raw, hvdlike) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    keyed: Dict[Any, Dict[str, Dict[str, Any]]] = {}
    for r in results:
        keyed.setdefault((r["link"], r["layout"], r["algorithm"], r["bytes"]), {})[r["series"]] = r
    for (link, layout, algo, n), s in keyed.items():
        raw, mine = s["raw"], s["hvdlike"]
        lines.append(
            f"| {link} | {layout} | {algo} | {human(n)} | {raw['time_s'] * 1e3:.3g} ms | "
            f"{mine['time_s'] * 1e3:.3g} ms | {mine['vs_raw']:.2f} | {raw['of_bound']:.2f} | "
            f"{mine['of_bound']:.2f} | {raw['link_vs_minimum']:.2f}, "
            f"{mine['link_vs_minimum']:.2f} |")
    return "\n".join(lines)


def plot(results: List[Dict[str, Any]], links: List[str], path: str) -> None:

    with figure(path, 1, len(links), figsize=(5 * len(links), 4), squeeze=False,
                dpi=110) as (fig, axes):
        for ax, link in zip(axes[0], links):
            lines: Dict[str, List[Any]] = {}
            for r in results:
                if r["link"] != link:
                    continue
                name = (f"raw MPI, {r['layout']}" if r["series"] == "raw"
                        else f"hvdlike {r['algorithm']}, {r['layout']}")
                if r["series"] == "raw" and r["algorithm"] != "flat":
                    continue  # one raw line per layout (from the flat job)
                lines.setdefault(name, []).append((r["bytes"], r["of_bound"]))
            for name, points in sorted(lines.items()):
                xs, ys = zip(*sorted(points))
                ax.plot(xs, ys, marker="o", ms=3, label=name,
                        linestyle="--" if name.startswith("raw") else "-")
            rate = next(r["line_rate"] for r in results if r["link"] == link)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("all-reduce size (bytes)")
            ax.set_ylabel("fraction of the bandwidth-optimal bound")
            ax.set_title(f"2 test hosts, link {link} ({rate / 2**20:.0f} MiB/s measured)")
            ax.set_ylim(0, 1.1)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)


def measure(args: argparse.Namespace, links: List[str], sizes: List[int],
            tmp: Path) -> List[Dict[str, Any]]:
    """Every link, layout and algorithm of the command line: the summarized rows."""
    from hvdlike.testing.cluster import Cluster
    results: List[Dict[str, Any]] = []
    for link in links:
        with Cluster(hosts=args.hosts, link=None if link == "none" else link,
                     prefix="hvdbc", net=80) as cluster:
            rate = line_rate(cluster)
            print(f"link {link}: TCP line rate {rate / 2**20:.0f} MiB/s", flush=True)
            for per_host in [int(x) for x in args.per_host.split(",")]:
                for algorithm in ["flat"] + (["hierarchical", "auto"] if per_host > 1 else []):
                    started = time.time()
                    rows = run_job(cluster, per_host, algorithm, sizes, tmp,
                                   args.job_timeout)
                    meta = dict(link=link, line_rate=rate, hosts=args.hosts,
                                per_host=per_host, layout=f"{args.hosts}x{per_host}",
                                algorithm=algorithm)
                    results += summarize(rows, args.hosts, per_host, rate, meta)
                    print(f"  {args.hosts}x{per_host} {algorithm}: "
                          f"{time.time() - started:.0f} s", flush=True)
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--links", default="1gbit,10gbit,none",
                   help="comma-separated tc rates, 'none' for an unshaped link")
    p.add_argument("--per-host", default="1,2", help="ranks per host to measure")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--min-size", type=parse_size, default=parse_size("1KiB"))
    p.add_argument("--max-size", type=parse_size, default=parse_size("256MiB"))
    p.add_argument("--job-timeout", type=float, default=1800,
                   help="seconds one mpirun job may take before the benchmark stops")
    p.add_argument("--sizes", help=argparse.SUPPRESS)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", default=str(REPO / "results" / "bench_cluster" / "bench_cluster"))
    args = p.parse_args()
    if args.worker:
        worker([int(s) for s in args.sizes.split(",")], args.worker)
        return 0
    from hvdlike.testing.cluster import missing_requirements
    why = missing_requirements()
    if why:
        print(f"bench_cluster needs the test cluster: {why}", file=sys.stderr)
        return 2
    sizes, s = [], args.min_size
    while s <= args.max_size:
        sizes.append(s)
        s *= 4
    links = args.links.split(",")
    with tempfile.TemporaryDirectory(prefix="bench_cluster-") as tmp:  # each job's figures
        results = measure(args, links, sizes, Path(tmp))
    print(table(results))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(
        {"command": shlex.join(sys.argv), "host": socket.gethostname(),
         "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "results": results},
        indent=1))
    plot(results, links, args.out + ".png")
    print(f"wrote {args.out}.json and {args.out}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
