"""Process sets: how long a set's blocking all-reduce takes while other ranks do something else.

    hvdlikerun -np 3 python scripts/bench_process_sets.py [--work-ms 0,3] [--seconds 1]
    hvdlikerun -np 4 python scripts/bench_process_sets.py   # adds two sets at work at once

Every engine round includes every rank (docs/collectives.md, process sets), so a set's call
also waits for the ranks outside it to take part. Timed, per ``--work-ms`` value (that much
``time.sleep`` before each call, as a training step's computation), 1 KiB float32 Sum:

  ``world``      every rank calls on the global set: the baseline;
  ``set_idle``   ranks 0 and 1 call on a set of their own while the others only sleep;
  ``two_sets``   (np >= 4) the even and the odd ranks call on their own sets, the odd ones
                 sleeping twice as long between calls.

A run lasts ``--seconds`` on rank 0's clock (the set's calls carry its "go on" flag). Reports
the median and 90th percentile of a call (the slowest member's median), and the median
against ``world``'s at the same work. Writes ``OUT.json`` and ``OUT.png`` and prints a table.
"""
import argparse
import json
import time
from pathlib import Path

import numpy as np

import hvdlike as hvd
from bench_output import figure


def _loop(seconds: float, work: float, process_set, name: str) -> list:
    """Blocking calls on ``process_set`` for ``seconds`` (rank 0 of the set decides when to
    stop); returns each call's time."""
    x = np.ones(256, np.float32)
    times = []
    start = time.perf_counter()
    go = True
    while go:
        if work:
            time.sleep(work)
        x[0] = float(process_set.rank() != 0 or time.perf_counter() - start < seconds)
        t0 = time.perf_counter()
        out = hvd.allreduce(x, op=hvd.Min, name=name, process_set=process_set)
        times.append(time.perf_counter() - t0)
        go = bool(out[0])
    return times


def _case(kind: str, seconds: float, work: float, sets) -> dict:
    rank, size = hvd.rank(), hvd.size()
    evens, odds, pair = sets
    hvd.barrier()
    times = []
    if kind == "world":
        times = _loop(seconds, work, hvd.global_process_set, f"world.{work}")
    elif kind == "set_idle":
        if rank in (0, 1):
            times = _loop(seconds, work, pair, f"pair.{work}")
        else:
            time.sleep(seconds + 0.3)
    else:  # two_sets
        mine = evens if rank % 2 == 0 else odds
        times = _loop(seconds, work * (1 + rank % 2), mine, f"half.{work}")
    mine = ((float(np.median(times)), float(np.percentile(times, 90))) if times
            else (None, None))
    gathered = hvd.allgather_object((mine, len(times)))
    (medians, p90s), calls = zip(*(m for m, _ in gathered)), [c for _, c in gathered]
    members = [r for r in range(size) if medians[r] is not None]
    return {"case": kind, "work_ms": 1e3 * work, "np": size, "members": members,
            "median_s": max(medians[r] for r in members),
            "p90_s": max(p90s[r] for r in members),
            "medians_by_rank_s": list(medians), "calls": calls}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work-ms", default="0,3",
                   help="comma-separated sleeps before each call, in ms (default 0,3)")
    p.add_argument("--seconds", type=float, default=1.0, help="length of each run")
    p.add_argument("--out", default="results/bench_process_sets")
    args = p.parse_args()
    hvd.init()
    if hvd.size() < 3:
        raise SystemExit("bench_process_sets.py needs 3 or more ranks (a set of two and a "
                         "rank outside it): hvdlikerun -np 3 python scripts/bench_process_sets.py")
    size = hvd.size()
    sets = (hvd.add_process_set(list(range(0, size, 2))),
            hvd.add_process_set(list(range(1, size, 2))),
            hvd.add_process_set([0, 1]))
    kinds = ["world", "set_idle"] + (["two_sets"] if size >= 4 else [])
    rows = []
    for work_ms in [float(w) for w in args.work_ms.split(",")]:
        for kind in kinds:
            rows.append(_case(kind, args.seconds, work_ms / 1e3, sets))
    hvd.barrier()
    if hvd.rank() != 0:
        return
    for r in rows:
        base = next(b for b in rows if b["case"] == "world" and b["work_ms"] == r["work_ms"])
        r["vs_world"] = r["median_s"] / base["median_s"]
    hdr = f"{'case':>9} {'work ms':>8} {'median us':>10} {'p90 us':>9} {'vs world':>9} {'calls':>7}"
    print(f"np={size}, 1 KiB float32 blocking all-reduce; median/p90: the slowest member's")
    print(hdr + "\n" + "-" * len(hdr))
    for r in rows:
        print(f"{r['case']:>9} {r['work_ms']:>8.1f} {1e6 * r['median_s']:>10.1f} "
              f"{1e6 * r['p90_s']:>9.1f} {r['vs_world']:>9.2f} "
              f"{max(r['calls']):>7}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    works = sorted({r["work_ms"] for r in rows})
    width = 0.8 / len(kinds)
    with figure(out.with_suffix(".png"), figsize=(7, 4)) as (fig, ax):
        for k, kind in enumerate(kinds):
            ys = [1e6 * next(r["median_s"] for r in rows
                             if r["case"] == kind and r["work_ms"] == w) for w in works]
            ax.bar([i + k * width for i in range(len(works))], ys, width, label=kind)
        ax.set_xticks([i + width * (len(kinds) - 1) / 2 for i in range(len(works))])
        ax.set_xticklabels([f"{w:g} ms of work" for w in works])
        ax.set_ylabel("median µs a call (slowest member)")
        ax.set_title(f"process sets, np={size}")
        ax.legend()
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
