#!/usr/bin/env python
"""All-reduce benchmark: hvdlike.allreduce against raw mpi4py ``comm.Allreduce``.

Run under MPI (as root add ``OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``;
``OMPI_MCA_osc=^ucx`` silences a harmless UCX message)::

    mpirun -np 2 python scripts/bench_allreduce.py \
        [--sizes 1KiB,4KiB,...,64MiB] [--iters N] [--batches B] \
        [--out results/bench_allreduce] [--op sum|average|adasum] [--no-secondary]

For each message size (float32, one array per call) three series are timed, interleaved in
rounds so that drift in machine load hits all of them alike:

* raw:    ``comm.Allreduce(send, recv, MPI.SUM)`` on preallocated NumPy buffers (the baseline);
* hvdlike ``hvd.allreduce(x, op=hvd.Sum)`` (the fair comparison: same arithmetic as raw);
* hvdlike ``hvd.allreduce(x, op=hvd.Average)`` (Sum plus the 1/n scaling pass).

``--op`` picks which hvdlike op is the headline (ratio column, targets, plot); the other op is
measured too unless ``--no-secondary`` (Sum beside Average or Adasum). The targets are defined
for Sum and Average: with ``--op adasum`` they are printed for comparison only. Each round runs a barrier and then a timed batch of
``iters`` calls; a batch's time per call is the slowest rank's, and the reported time is the
median over ``--batches`` rounds. ``iters`` is scaled with the size (about 16 MiB of traffic per
batch, 4..500 calls) unless ``--iters`` fixes it. Many short batches and the median make the
result robust to other processes stealing the CPU now and then. Before the first size, raw and
hvdlike calls run untimed for ``--warmup`` seconds (the first seconds after launch are often slow).
Each batch also records minor page faults per call (slowest rank): a non-zero count means the
call touched freshly mapped memory, which on this kind of machine costs more than the copy.

Reported per size: time per call, algbw = bytes / time, busbw = algbw * 2(n-1)/n, and
ratio = hvdlike throughput / raw throughput (= raw time / hvdlike time). Rank 0 prints a table
and writes ``OUT.json`` (all numbers and metadata) and ``OUT.png`` (algbw vs size and the ratio).

``--together`` times each call on its own, started together on every rank right after a
barrier (the barrier is not timed), as a training step's single all-reduce starts: the
per-call fixed costs then show instead of being hidden by back-to-back calls. It also times
how long ``allreduce_async`` takes to return on rank 0 while the other ranks submit the same
name 50 ms later (median of 30).

All ranks must get the same arguments. Targets checked (they are defined at np=2): hvdlike >= 0.95x raw throughput for every size
>= 1 MiB, and hvdlike latency <= 10x raw at 1 KiB; with ``--together`` also >= 1.3x raw at
1 MiB and >= 1.8x at 64 MiB, and an async call returning in <= 50 us before its peers.
"""
import argparse
import datetime
import os
import platform
import re
import socket
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

import hvdlike as hvd
from bench_output import figure, markdown_table, write_json

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

DEFAULT_SIZES = "1KiB,4KiB,16KiB,64KiB,256KiB,1MiB,4MiB,16MiB,64MiB"
BYTES_PER_BATCH = 16 * 1024 * 1024
MIN_ITERS, MAX_ITERS = 4, 500
TARGET_BIG_BYTES = 1 << 20  # throughput target applies at and above 1 MiB
TARGET_TOGETHER = {1 << 20: 1.3, 64 << 20: 1.8}  # --together: single calls vs raw MPI
TARGET_ASYNC_SUBMIT_S = 50e-6  # --together: allreduce_async returns this fast on an early rank
ASYNC_PEER_DELAY_S = 0.05
TARGET_BIG_RATIO = 0.95
TARGET_SMALL_BYTES = 1 << 10  # latency target applies at 1 KiB
TARGET_SMALL_FACTOR = 10.0

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
          "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def parse_size(text: str) -> int:
    """'1KiB', '4k', '64MiB', '1048576' -> bytes (binary units; a multiple of 4 bytes)."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"bad size {text!r}; use e.g. 1KiB, 4MiB or 4096")
    nbytes = int(m.group(1)) * _UNITS[m.group(2).lower()]
    if nbytes <= 0 or nbytes % 4:
        raise argparse.ArgumentTypeError(f"size {text!r} must be a positive multiple of 4 bytes "
                                         "(float32 elements)")
    return nbytes


def parse_sizes(text: str) -> List[int]:
    return [parse_size(s) for s in text.split(",") if s.strip()]


def human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def iters_for(nbytes: int, fixed: Optional[int]) -> int:
    if fixed:
        return fixed
    return max(MIN_ITERS, min(MAX_ITERS, BYTES_PER_BATCH // nbytes))


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes(DEFAULT_SIZES),
                   help=f"comma-separated message sizes in bytes (default {DEFAULT_SIZES})")
    p.add_argument("--iters", type=int, default=None,
                   help="calls per timed batch for every size (default: scaled by size, "
                        f"~{BYTES_PER_BATCH >> 20} MiB per batch, {MIN_ITERS}..{MAX_ITERS})")
    p.add_argument("--warmup", type=float, default=1.0,
                   help="seconds of untimed calls before the first size (default 1.0)")
    p.add_argument("--batches", type=int, default=21,
                   help="timed batches (rounds) per series and size; the median is reported")
    p.add_argument("--out", default="results/bench_allreduce",
                   help="output path prefix: writes OUT.json and OUT.png (rank 0)")
    p.add_argument("--op", choices=("sum", "average", "adasum"), default="sum",
                   help="hvdlike op used for the ratio, the targets and the plot (default sum)")
    p.add_argument("--no-secondary", action="store_true",
                   help="do not also time the other hvdlike op")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--together", action="store_true",
                   help="time each call alone, started together after an (untimed) barrier")
    args = p.parse_args(argv)
    if args.iters is not None and args.iters < 1:
        p.error("--iters must be >= 1")
    if args.batches < 1:
        p.error("--batches must be >= 1")
    return args


# ----------------------------------------------------------------------------- measuring

def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource else 0


def timed_batch(comm: MPI.Comm, fn: Callable[[], object], iters: int,
                together: bool = False) -> Tuple[float, float]:
    """(seconds per call, minor page faults per call) of ``fn`` over one batch, each the
    slowest rank's (every rank gets them). Page faults show fresh memory being touched.
    ``together``: a barrier before every call, outside the timed part."""
    comm.Barrier()
    f0 = _minor_faults()
    if together:
        elapsed = 0.0
        for _ in range(iters):
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            elapsed += time.perf_counter() - t0
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        elapsed = time.perf_counter() - t0
    per_call = elapsed / iters
    faults = (_minor_faults() - f0) / iters
    worst = np.empty(2)
    comm.Allreduce(np.array([per_call, faults]), worst, MPI.MAX)
    return float(worst[0]), float(worst[1])


def global_warmup(comm: MPI.Comm, seconds: float) -> None:
    """Untimed raw and hvdlike calls for about ``seconds`` (rank 0's clock decides for all)."""
    x = np.ones(16 * 1024, np.float32)
    y = np.empty_like(x)
    t0 = time.perf_counter()
    while True:
        for _ in range(50):
            comm.Allreduce(x, y, MPI.SUM)
            hvd.allreduce(x, op=hvd.Sum, name="bench.warmup")
        if comm.bcast(time.perf_counter() - t0 >= seconds, root=0):
            return


def bench_size(comm: MPI.Comm, nbytes: int, iters: int, batches: int,
               hvd_ops: Dict[str, object],
               together: bool = False) -> Dict[str, List[Tuple[float, float]]]:
    """Per batch (seconds per call, page faults per call) for 'raw' and each hvdlike op,
    measured in interleaved rounds."""
    n = nbytes // 4
    rank = comm.Get_rank()
    rng = np.random.default_rng(1234 + rank)
    # Made directly in float32: a float64 temporary would be freed here and raise glibc's
    # dynamic mmap/trim thresholds, which hides the allocator cost of fresh result arrays.
    send = rng.standard_normal(n, dtype=np.float32)
    recv = np.empty_like(send)
    name = f"bench.{nbytes}"

    def raw() -> None:
        comm.Allreduce(send, recv, MPI.SUM)

    fns: Dict[str, Callable[[], object]] = {"raw": raw}
    for label, op in hvd_ops.items():
        fns[label] = (lambda op=op: hvd.allreduce(send, op=op, name=name))

    # Correctness (untimed): hvdlike's Sum equals MPI's on every rank, up to float32 rounding
    # (above 2 ranks the two may add the ranks' values in a different order).
    raw()
    got = hvd.allreduce(send, op=hvd.Sum, name=name)
    if not np.allclose(got, recv, rtol=1e-5, atol=1e-5):
        raise AssertionError(f"rank {rank}: hvdlike Sum differs from MPI_Allreduce at "
                             f"{human(nbytes)} (max abs diff {np.abs(got - recv).max()})")

    # Warm-up: a few untimed calls of each series (page-in, MPI protocol setup, caches).
    warm = max(2, min(iters, 20))
    for fn in fns.values():
        for _ in range(warm):
            fn()

    times: Dict[str, List[Tuple[float, float]]] = {label: [] for label in fns}
    order = list(fns)
    for b in range(batches):
        # Alternate the order of the series in each round so none always goes first.
        for label in (order if b % 2 == 0 else order[::-1]):
            times[label].append(timed_batch(comm, fns[label], iters, together))
    return times


def summarize(nbytes: int, batches: List[Tuple[float, float]], nranks: int) -> Dict:
    per_call = [t for t, _ in batches]
    t = statistics.median(per_call)
    algbw = nbytes / t
    return {
        "time_s": t,
        "time_min_s": min(per_call),
        "time_max_s": max(per_call),
        "algbw_Bps": algbw,
        "busbw_Bps": algbw * 2 * (nranks - 1) / nranks if nranks > 1 else algbw,
        "minor_faults_per_call": statistics.median(f for _, f in batches),
        "batches_s": per_call,
    }


# ----------------------------------------------------------------------------- reporting

def fmt_time(seconds: float) -> str:
    us = seconds * 1e6
    if us < 1000:
        return f"{us:.1f} us" if us < 100 else f"{us:.0f} us"
    return f"{us / 1000:.2f} ms"


def fmt_bw(bps: float) -> str:
    return f"{bps / 1e9:.3f}" if bps < 1e10 else f"{bps / 1e9:.2f}"


def table(rows: List[Dict], primary: str, secondary: Optional[str]) -> str:
    head = ["size", f"hvd {primary} time", "algbw GB/s", "busbw GB/s", "raw time",
            "raw algbw GB/s", "ratio"]
    if secondary:
        head += [f"hvd {secondary} time", f"{secondary} ratio"]
    lines = []
    for r in rows:
        p, raw = r["hvdlike"][primary], r["raw"]
        cells = [human(r["bytes"]), fmt_time(p["time_s"]), fmt_bw(p["algbw_Bps"]),
                 fmt_bw(p["busbw_Bps"]), fmt_time(raw["time_s"]), fmt_bw(raw["algbw_Bps"]),
                 f"{r['ratio'][primary]:.3f}"]
        if secondary:
            s = r["hvdlike"][secondary]
            cells += [fmt_time(s["time_s"]), f"{r['ratio'][secondary]:.3f}"]
        lines.append(cells)
    return markdown_table(head, lines)


def async_submit(comm: MPI.Comm, repeats: int = 30) -> Dict:
    """How long ``allreduce_async`` (1 KiB) takes to return on rank 0 while the other ranks
    submit the same name ASYNC_PEER_DELAY_S later: the call must not wait for them."""
    x = np.ones(256, np.float32)
    times, done_at_return = [], 0
    for _ in range(repeats):
        comm.Barrier()
        if comm.Get_rank() == 0:
            t0 = time.perf_counter()
            handle = hvd.allreduce_async(x, op=hvd.Sum, name="bench.async_submit")
            times.append(time.perf_counter() - t0)
            done_at_return += handle.poll()
        else:
            time.sleep(ASYNC_PEER_DELAY_S)
            handle = hvd.allreduce_async(x, op=hvd.Sum, name="bench.async_submit")
        handle.synchronize()
    median = statistics.median(times) if times else 0.0
    return {"rule": f"allreduce_async returns in <= {TARGET_ASYNC_SUBMIT_S * 1e6:.0f} us while "
                    f"the peers call {ASYNC_PEER_DELAY_S * 1e3:.0f} ms later",
            "median_s": median, "max_s": max(times) if times else 0.0,
            "done_at_return": done_at_return, "repeats": repeats,
            "met": median <= TARGET_ASYNC_SUBMIT_S and done_at_return == 0}


def check_targets(rows: List[Dict], primary: str, nranks: int, together: bool = False) -> Dict:
    big = [r for r in rows if r["bytes"] >= TARGET_BIG_BYTES]
    small = [r for r in rows if r["bytes"] == TARGET_SMALL_BYTES]
    out: Dict = {"np": nranks, "defined_at_np": 2, "op": primary, "together": together}
    if together:
        out["started_together"] = {
            human(size): {"rule": f">= {want}x raw", "met": None} if row is None else
            {"rule": f">= {want}x raw", "ratio": row["ratio"][primary],
             "met": row["ratio"][primary] >= want}
            for size, want in TARGET_TOGETHER.items()
            for row in [next((r for r in rows if r["bytes"] == size), None)]}
    if big:
        worst = min(big, key=lambda r: r["ratio"][primary])
        out["throughput"] = {
            "rule": f"hvdlike throughput >= {TARGET_BIG_RATIO} x raw for every size >= 1 MiB",
            "worst_size_bytes": worst["bytes"], "worst_ratio": worst["ratio"][primary],
            "per_size": {str(r["bytes"]): r["ratio"][primary] for r in big},
            "met": all(r["ratio"][primary] >= TARGET_BIG_RATIO for r in big),
        }
    else:
        out["throughput"] = {"met": None, "note": "no size >= 1 MiB measured"}
    if small:
        r = small[0]
        factor = r["hvdlike"][primary]["time_s"] / r["raw"]["time_s"]
        out["latency"] = {
            "rule": f"hvdlike time <= {TARGET_SMALL_FACTOR:g} x raw at 1 KiB",
            "factor": factor, "hvdlike_s": r["hvdlike"][primary]["time_s"],
            "raw_s": r["raw"]["time_s"], "met": factor <= TARGET_SMALL_FACTOR,
        }
    else:
        out["latency"] = {"met": None, "note": "1 KiB not measured"}
    return out


def targets_text(t: Dict) -> str:
    def verdict(met: Optional[bool]) -> str:
        return "not measured" if met is None else ("MET" if met else "MISSED")

    lines = [f"Targets (defined at np=2; this run np={t['np']}, hvdlike op={t['op']}):"]
    if t["op"] == "adasum":
        lines.append("  (defined for Sum and Average: Adasum's verdicts are for comparison only)")
    th, la = t["throughput"], t["latency"]
    if th["met"] is None:
        lines.append(f"  throughput >= {TARGET_BIG_RATIO}x raw at >= 1 MiB: not measured")
    else:
        lines.append(f"  throughput >= {TARGET_BIG_RATIO}x raw at >= 1 MiB: {verdict(th['met'])} "
                     f"(worst {th['worst_ratio']:.3f} at {human(th['worst_size_bytes'])})")
    if la["met"] is None:
        lines.append(f"  latency <= {TARGET_SMALL_FACTOR:g}x raw at 1 KiB: not measured")
    else:
        lines.append(f"  latency <= {TARGET_SMALL_FACTOR:g}x raw at 1 KiB: {verdict(la['met'])} "
                     f"({la['factor']:.1f}x: {fmt_time(la['hvdlike_s'])} vs "
                     f"{fmt_time(la['raw_s'])})")
    for size, tt in t.get("started_together", {}).items():
        got = "" if tt["met"] is None else f" ({tt['ratio']:.2f}x)"
        lines.append(f"  started together, {size}: {tt['rule']}: {verdict(tt['met'])}{got}")
    if "async_submit" in t:
        a = t["async_submit"]
        lines.append(f"  {a['rule']}: {verdict(a['met'])} (median {fmt_time(a['median_s'])}, "
                     f"max {fmt_time(a['max_s'])}, {a['done_at_return']} of {a['repeats']} "
                     "done at return)")
    return "\n".join(lines)


def plot(rows: List[Dict], primary: str, secondary: Optional[str], meta: Dict,
         path: str) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    x = [r["bytes"] for r in rows]
    labels = [human(b).replace(" ", "") for b in x]
    with figure(path, 2, 1, figsize=(8, 7.5), sharex=True,
                gridspec_kw={"height_ratios": [2.2, 1]}, dpi=120) as (fig, (ax, axr)):
        ax.plot(x, [r["raw"]["algbw_Bps"] / 1e9 for r in rows], "o-", color="tab:gray", lw=2,
                label="raw mpi4py comm.Allreduce (SUM)")
        ax.plot(x, [r["hvdlike"][primary]["algbw_Bps"] / 1e9 for r in rows], "s-",
                color="tab:blue", lw=2, label=f"hvdlike.allreduce (op={primary.title()})")
        if secondary:
            ax.plot(x, [r["hvdlike"][secondary]["algbw_Bps"] / 1e9 for r in rows], "^--",
                    color="tab:orange", lw=1.2, ms=5,
                    label=f"hvdlike.allreduce (op={secondary.title()})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(
            lambda v, _: f"{v:g}" if f"{v:.1e}"[0] in "25" else ""))
        ax.tick_params(axis="y", which="minor", labelsize=8)
        ax.set_ylabel("algbw (GB/s) = bytes / time")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right")
        notes = [f"{k}={v}" for k, v in meta.get("env", {}).items()
                 if k.startswith(("HVDLIKE_", "GLIBC_TUNABLES", "MALLOC_"))]
        ax.set_title(f"All-reduce float32, np={meta['np']}, {meta['host']}\n"
                     f"{meta['mpi_library_short']}, mpi4py {meta['mpi4py_version']}, "
                     f"{meta['date'][:10]}" + ("\n" + ", ".join(notes) if notes else ""),
                     fontsize=9 if notes else 10)

        axr.axhline(1.0, color="black", lw=0.8)
        axr.axhline(TARGET_BIG_RATIO, color="tab:red", lw=1, ls=":",
                    label=f"target {TARGET_BIG_RATIO} (>= 1 MiB)")
        axr.axvspan(TARGET_BIG_BYTES / 1.4, max(x) * 1.4, color="tab:red", alpha=0.06)
        ratios = [r["ratio"][primary] for r in rows]
        axr.plot(x, ratios, "s-", color="tab:blue", lw=2, label=f"hvdlike {primary.title()} / raw")
        for xi, ri in zip(x, ratios):
            axr.annotate(f"{ri:.2f}", (xi, ri), textcoords="offset points", xytext=(0, 7),
                         ha="center", fontsize=7, color="tab:blue",
                         bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8))
        if TARGET_SMALL_BYTES in x:
            axr.plot([TARGET_SMALL_BYTES], [1 / TARGET_SMALL_FACTOR], marker="_", ms=18, mew=2,
                     color="tab:red", ls="none",
                     label=f"target 1 KiB: >= {1 / TARGET_SMALL_FACTOR:g} (<= "
                           f"{TARGET_SMALL_FACTOR:g}x raw latency)")
        if secondary:
            axr.plot(x, [r["ratio"][secondary] for r in rows], "^--", color="tab:orange", lw=1.2,
                     ms=5, label=f"hvdlike {secondary.title()} / raw")
        axr.set_ylabel("throughput ratio\nhvdlike / raw")
        top = max(1.45, max(max(r["ratio"].values()) for r in rows) * 1.15)
        axr.set_ylim(0, top)
        axr.grid(True, alpha=0.3)
        axr.legend(loc="upper left", fontsize=7, ncol=2)
        axr.set_xscale("log", base=2)
        axr.xaxis.set_major_locator(FixedLocator(x))
        axr.xaxis.set_minor_locator(NullLocator())
        axr.set_xticklabels(labels)
        axr.set_xlabel("message size (float32 array, bytes)")
        axr.set_xlim(min(x) / 1.4, max(x) * 1.4)


def metadata(comm: MPI.Comm, args: argparse.Namespace) -> Dict:
    import mpi4py
    from hvdlike import runtime

    lib = MPI.Get_library_version().strip()
    hosts = sorted(set(comm.allgather(socket.gethostname())))
    return {
        "np": comm.Get_size(),
        "hosts": hosts,
        "host": ",".join(hosts),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "mpi_library_version": lib,
        "mpi_library_short": lib.splitlines()[0].split(",")[0],
        "mpi_standard": "{}.{}".format(*MPI.Get_version()),
        "mpi4py_version": mpi4py.__version__,
        "numpy_version": np.__version__,
        "python_version": platform.python_version(),
        "hvdlike_version": hvd.__version__,
        "hvdlike_settings": {k: v for k, v in vars(runtime.state().settings).items()},
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "dtype": "float32",
        "timing": "per size: warm-up, then interleaved rounds (order alternating); each round "
                  "= barrier + batch of iters calls; per-call time of a batch = slowest rank; "
                  "reported = median over batches",
        "batches": args.batches,
        "warmup_s": args.warmup,
        "iters_fixed": args.iters,
        "primary_op": args.op,
        "argv": sys.argv,
        "env": {k: v for k, v in os.environ.items()
                if k.startswith(_ENV_PREFIXES) and k not in _ENV_SKIP},
    }


_ENV_PREFIXES = ("HVDLIKE_", "GLIBC_TUNABLES", "MALLOC_", "OMPI_MCA_", "OMP_NUM_THREADS")
_ENV_SKIP = ("OMPI_MCA_PREFIXES", "OMPI_MCA_num_procs", "OMPI_MCA_initial_wdir",
             "OMPI_MCA_cpu_type")  # set by mpirun itself


def _cpu_model() -> Optional[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


# ----------------------------------------------------------------------------- main

def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    hvd.init()
    comm = MPI.COMM_WORLD.Dup()  # the baseline's own communicator, like hvdlike's
    rank, nranks = comm.Get_rank(), comm.Get_size()
    primary = args.op
    secondary = None if args.no_secondary else ("average" if primary == "sum" else "sum")
    ops = {"sum": hvd.Sum, "average": hvd.Average, "adasum": hvd.Adasum}
    hvd_ops = {primary: ops[primary]}
    if secondary:
        hvd_ops[secondary] = ops[secondary]
    meta = metadata(comm, args)
    if rank == 0:
        print(f"bench_allreduce: np={nranks} on {meta['host']}, {meta['mpi_library_short']}, "
              f"sizes {', '.join(human(s) for s in args.sizes)}, {args.batches} batches",
              flush=True)

    if args.warmup > 0:
        global_warmup(comm, args.warmup)
    started = time.perf_counter()
    rows = []
    for nbytes in args.sizes:
        iters = iters_for(nbytes, args.iters)
        t0 = time.perf_counter()
        times = bench_size(comm, nbytes, iters, args.batches, hvd_ops, args.together)
        raw = summarize(nbytes, times["raw"], nranks)
        row = {"bytes": nbytes, "elements": nbytes // 4, "iters": iters,
               "batches": args.batches, "raw": raw, "hvdlike": {}, "ratio": {}}
        for label in hvd_ops:
            s = summarize(nbytes, times[label], nranks)
            row["hvdlike"][label] = s
            row["ratio"][label] = raw["time_s"] / s["time_s"]
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        if rank == 0:
            p = row["hvdlike"][primary]
            print(f"  {human(nbytes):>8}: hvdlike {fmt_time(p['time_s']):>9}  raw "
                  f"{fmt_time(raw['time_s']):>9}  ratio {row['ratio'][primary]:.3f}  "
                  f"page faults/call hvdlike {p['minor_faults_per_call']:.0f} raw "
                  f"{raw['minor_faults_per_call']:.0f}  "
                  f"({iters} calls x {args.batches} batches, {row['wall_s']:.1f} s)", flush=True)
    submit = async_submit(comm) if args.together and nranks > 1 else None
    total = time.perf_counter() - started
    hvd.barrier()

    if rank == 0:
        meta["wall_s"] = total
        targets = check_targets(rows, primary, nranks, args.together)
        if submit is not None:
            targets["async_submit"] = submit
        print()
        print(table(rows, primary, secondary))
        print()
        print("time = median over batches of the per-call time (slowest rank); "
              "GB/s = 1e9 bytes/s; ratio = hvdlike throughput / raw throughput")
        print(targets_text(targets))
        out_dir = os.path.dirname(args.out)
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
        result = {"metadata": meta, "results": rows, "targets": targets,
                  "table_markdown": table(rows, primary, secondary)}
        write_json(args.out + ".json", result)
        written = [args.out + ".json"]
        if not args.no_plot:
            plot(rows, primary, secondary, meta, args.out + ".png")
            written.append(args.out + ".png")
        print(f"wrote {', '.join(written)} (benchmark {total:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
