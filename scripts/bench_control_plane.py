#!/usr/bin/env python
"""The engine's control plane at world sizes this machine cannot start: the real negotiation
code of P simulated ranks, in one process, through an in-process stand-in for the few
collectives a round uses.

    python scripts/bench_control_plane.py [--ranks 2,1024,16384] [--json PATH] [--png PATH]
        [--rounds 200] [--old-commit e6b88e3] [--old-first-step-ranks 1024]

What a rank does in a round depends on what the others do, not on how many they are, so the
P ranks are simulated in *classes* of ranks that behave alike (here two: the ranks on time
and the ranks a round late). Each class has its own ``Negotiation`` (rank = the class's
lowest rank), exactly the object the engine uses. A steady round needs only its AND, which
this script computes between the classes' turns on one thread; the first step needs the
other collectives too, so there each class runs on a thread of its own and
scripts/simulated_world.py's stand-in hands each collective every class's contribution and
gives back what MPI would (the AND of the vectors, the minimum, the root's broadcast, P
gathered objects). Per rank it measures the CPU time spent in the negotiation code, including
pickling what it sends and unpickling what it receives, but not the stand-in's own work
(MPI's reduction, which a real rank does log2(P) times on the vector, and the transfer).

Cases, per P:
* ``round_cpu_ms``: a steady-state round in which the ranks' pending sets differ (the late
  half has 107 of ResNet-50's 214 cached gradients pending, the others all 214): median over
  ``--rounds`` rounds, the slower class;
* ``round_same_cpu_ms``: the same with every rank's pending set equal (a repeating step);
* ``round_bytes_per_rank``: the bytes a rank hands to a steady round's collectives (sent +
  received buffers; MPI's algorithm adds its own log P steps on top);
* ``first_step_cpu_s``: ResNet-50's 214 gradients seen for the first time (half the ranks
  submit them a round later), per rank, from the first round to the one that runs them;
  ``first_step_bytes_per_rank``: what the rank sends and receives over those rounds.

``--old-commit`` measures the design before the fixed-size rounds from git (the rows gathered
from every rank and parsed; announcements object-gathered from every rank), fed the same
cases: the rows a real all-gather would deliver, P pickled announcement lists.
``--old-first-step-ranks`` caps the P at which that first step is run (it grows as P x 214).

``projected_round_us`` adds the network to a steady round's CPU with the alpha-beta model of
docs/multinode.md (``--alpha-us`` per message step, ``--link-gbit``): the new round's AND as
recursive doubling, ceil(log2 P) steps of one vector each way; the old round's all-gather of
P rows, ceil(log2 P) steps carrying (P - 1) rows in all.

What the simulation leaves out: the network (only modelled, as above), MPI's own CPU in the
collective, and the engine's bookkeeping of its own requests around the negotiation (per
request, the same at any P).
"""
import argparse
import importlib.util
import math
import os
import pickle
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hvdlike.engine.checks import Request  # noqa: E402
from hvdlike.engine import negotiation  # noqa: E402
from hvdlike.engine.negotiation import Negotiation  # noqa: E402
from hvdlike.engine.rounds import Mine  # noqa: E402
from simulated_world import SimNet, World, run_classes  # noqa: E402
from bench_output import figure, write_json  # noqa: E402

CAPACITY = 1024  # the default HVDLIKE_CACHE_CAPACITY
DEFAULT_OLD_COMMIT = "e6b88e3"  # the last commit with rows gathered from every rank
TARGET_ROUND_CPU_MS = 0.1
TARGET_FIRST_STEP_S = 0.2


def resnet50_requests() -> List[Request]:
    """The 214 all-reduce requests of ResNet-50's gradients (float32, Average)."""
    sys.path.insert(0, str(REPO / "scripts"))
    from resnet50 import resnet50_shapes  # the shapes, without TensorFlow
    return [Request("allreduce", f"DistributedGradientTape_Allreduce/grad_{i}",
                    np.dtype(np.float32), shape, 1) for i, shape in enumerate(resnet50_shapes())]


def _classes(size: int) -> List[range]:
    """The ranks on time and the ranks a round late (one class at P=1)."""
    half = max(1, size // 2)
    return [range(0, half)] + ([range(half, size)] if size > 1 else [])


# ----------------------------------------------------------------------------- new design

def _cached_negotiation(size: int, rank: int, requests: List[Request]) -> Negotiation:
    """A rank's negotiation with ``requests`` in its cache at positions 0.. (as a first step
    that every rank saw alike leaves it)."""
    neg = Negotiation(size, CAPACITY, lambda set_id: range(size), rank)
    for i, request in enumerate(requests):
        neg._insert((0, request.name), request)
    return neg


class _NoCollectives:
    """A steady round calls no collective beyond its all-reduce: any call is a failure."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a steady round called the collective {name}")


def new_steady(size: int, requests: List[Request], rounds: int,
               same: bool) -> Tuple[float, int]:
    """Median CPU (s) of a steady round, the slower class; bytes per rank per round. The two
    classes run in turns on this thread (a steady round needs nothing but the AND, done here
    between the turns and not counted)."""
    n = len(requests)
    everything = (1 << n) - 1
    negs = [_cached_negotiation(size, ranks.start, requests) for ranks in _classes(size)]
    mines = [Mine(bits=everything if same or i == 0 else (1 << (n // 2)) - 1, waiting=True)
             for i in range(len(negs))]
    net = _NoCollectives()
    times: List[List[float]] = [[] for _ in negs]
    for _ in range(rounds):
        spent = []
        for neg, mine in zip(negs, mines):
            start = time.thread_time()
            neg.vector(mine)
            spent.append(time.thread_time() - start)
        reduced = np.bitwise_and.reduce(np.stack([neg.contribution for neg in negs]))
        for i, (neg, mine) in enumerate(zip(negs, mines)):
            start = time.thread_time()
            neg.conclude(neg.read(reduced.copy()), mine, net)  # type: ignore[arg-type]
            times[i].append(spent[i] + time.thread_time() - start)
    return max(statistics.median(t) for t in times), 2 * negs[0].vector_bytes


def new_first_step(size: int, requests: List[Request]) -> Tuple[float, int, int]:
    """CPU (s) per rank, bytes per rank and rounds for the first sight of ``requests``: the
    first class submits them in round 0, the late class in round 1."""
    world = World(size, _classes(size))

    def body(index: int, net: SimNet) -> Tuple[float, int, int]:
        neg = Negotiation(size, CAPACITY, lambda set_id: range(size), world.classes[index].start)
        pending: Dict[Any, Request] = {}
        cpu, rounds = 0.0, 0
        while True:
            if rounds == index:  # this class submits now
                pending = {(0, r.name): r for r in requests}
            start = time.thread_time()
            net.excluded = 0.0
            uncached = [(key, request, None) for key, request in pending.items()]
            mine = Mine(uncached=uncached, waiting=bool(pending), pending=pending)
            neg.vector(mine)
            result = neg.conclude(neg.read(net.band(neg.contribution)), mine, net)
            for response in result.responses:
                pending.pop(response.key, None)
            cpu += time.thread_time() - start - net.excluded
            rounds += 1
            done = world.exchange(index, rounds > index and not pending)
            if all(done):
                return cpu, net.bytes, rounds

    results = run_classes(world, body)
    return max(c for c, _, _ in results), max(b for _, b, _ in results), results[0][2]


# ----------------------------------------------------------------------------- old design

# modules the old negotiation imports that have moved since, as seen from hvdlike.engine
_MOVED = {"..checks": ".checks", "..errors": "..base.errors", "..reduce_ops": "..base.reduce_ops",
          "..log": "..base.log"}


def load_old(commit: str) -> Any:
    """The negotiation module as it was at ``commit`` (read from git)."""
    source = subprocess.check_output(
        ["git", "-C", str(REPO), "show", f"{commit}:hvdlike/engine/negotiation.py"], text=True)
    for was, now in _MOVED.items():  # its imports, where those modules are now
        source = source.replace(f"from {was} import", f"from {now} import")
    name = "hvdlike.engine._negotiation_at_" + commit
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    module.__package__ = "hvdlike.engine"
    sys.modules[name] = module  # its announcements are pickled
    exec(compile(source, f"{commit}:hvdlike/engine/negotiation.py", "exec"), module.__dict__)
    return module


def _old_cached(old: Any, size: int, requests: List[Request]) -> Any:
    neg = old.Negotiation(size, CAPACITY, lambda set_id: range(size), 0)
    for request in requests:
        neg._insert((0, request.name), request)
    return neg


def old_steady(old: Any, size: int, requests: List[Request], rounds: int,
               same: bool) -> Tuple[float, int]:
    n = len(requests)
    neg = _old_cached(old, size, requests)
    late = neg.row((1 << (n // 2)) - 1, 0, -1, False, False).copy()
    mine = neg.row((1 << n) - 1, 0, -1, False, False).copy()
    rows = np.tile(mine, (size, 1))
    if not same:
        rows[size // 2:] = late
    times = []
    for _ in range(rounds):
        neg.row((1 << n) - 1, 0, -1, False, False)
        start = time.thread_time()
        neg.decide(neg.parse(rows), None)
        times.append(time.thread_time() - start)
    return statistics.median(times), mine.nbytes * (1 + size)


def old_first_step(old: Any, size: int, requests: List[Request]) -> Tuple[float, int, int]:
    """Rank 0 of the old design: round 0, the first half announces; round 1, the rest."""
    neg = old.Negotiation(size, CAPACITY, lambda set_id: range(size), 0)
    announce = [old.Announcement((0, r.name), r, None) for r in requests]
    blob = pickle.dumps(announce, pickle.HIGHEST_PROTOCOL)
    empty = pickle.dumps([], pickle.HIGHEST_PROTOCOL)
    half = max(1, size // 2)
    cpu, sent = 0.0, 0
    for round_no in range(2 if size > 1 else 1):
        now = range(0, half) if round_no == 0 else range(half, size)
        row = neg.row(0, len(announce), -1, False, False).copy()
        idle = neg.row(0, 0, -1, False, False).copy()
        rows = np.stack([row if r in now else idle for r in range(size)])
        blobs = [blob if r in now else empty for r in range(size)]
        start = time.thread_time()
        lists = [pickle.loads(b) for b in blobs]  # what mpi4py's allgather unpickles
        neg.decide(neg.parse(rows), lists)
        cpu += time.thread_time() - start
        sent += row.nbytes * (1 + size) + len(blob if 0 in now else empty) + sum(map(len, blobs))
    return cpu, sent, 2 if size > 1 else 1


# ----------------------------------------------------------------------------- report

def projected_round_us(row: Dict, alpha_us: float, link_gbit: float) -> float:
    """A steady round's time on a network: its CPU plus the alpha-beta cost of its exchange."""
    size = row["ranks"]
    steps = math.ceil(math.log2(size)) if size > 1 else 0
    per_byte_us = 8 / (link_gbit * 1e3)  # microseconds per byte
    if row["design"] == "new":
        vector = row["round_bytes_per_rank"] / 2
        network = steps * (alpha_us + vector * per_byte_us)
    else:
        each = row["round_bytes_per_rank"] / (1 + size)
        network = steps * alpha_us + (size - 1) * each * per_byte_us
    return row["round_cpu_ms"] * 1e3 + network


def measure(sizes: List[int], rounds: int, old: Any, old_first_max: int) -> List[Dict]:
    requests = resnet50_requests()
    rows: List[Dict] = []
    for size in sizes:
        cpu, nbytes = new_steady(size, requests, rounds, same=False)
        same_cpu, _ = new_steady(size, requests, rounds, same=True)
        first, first_bytes, first_rounds = new_first_step(size, requests)
        rows.append(dict(design="new", ranks=size, round_cpu_ms=cpu * 1e3,
                         round_same_cpu_ms=same_cpu * 1e3, round_bytes_per_rank=nbytes,
                         first_step_cpu_s=first, first_step_bytes_per_rank=first_bytes,
                         first_step_rounds=first_rounds))
        print(_line(rows[-1]), flush=True)
        if old is None:
            continue
        cpu, nbytes = old_steady(old, size, requests, max(5, rounds // 10), same=False)
        same_cpu, _ = old_steady(old, size, requests, max(5, rounds // 10), same=True)
        row = dict(design="old", ranks=size, round_cpu_ms=cpu * 1e3,
                   round_same_cpu_ms=same_cpu * 1e3, round_bytes_per_rank=nbytes,
                   first_step_cpu_s=None, first_step_bytes_per_rank=None, first_step_rounds=None)
        if size <= old_first_max:
            first, first_bytes, first_rounds = old_first_step(old, size, requests)
            row.update(first_step_cpu_s=first, first_step_bytes_per_rank=first_bytes,
                       first_step_rounds=first_rounds)
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _fmt_bytes(n: Optional[float]) -> str:
    if n is None:
        return "-"
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _line(r: Dict) -> str:
    first = "-" if r["first_step_cpu_s"] is None else f"{r['first_step_cpu_s']:.4f}"
    return (f"| {r['design']} | {r['ranks']} | {r['round_cpu_ms']:.4f} | "
            f"{r['round_same_cpu_ms']:.4f} | {_fmt_bytes(r['round_bytes_per_rank'])} | {first} | "
            f"{_fmt_bytes(r['first_step_bytes_per_rank'])} |")


HEADER = ("| design | ranks | round CPU ms (pending sets differ) | round CPU ms (equal) | "
          "round bytes/rank | first step CPU s | first step bytes/rank |\n"
          "|---|---|---|---|---|---|---|")


def targets(rows: List[Dict]) -> List[str]:
    new = {r["ranks"]: r for r in rows if r["design"] == "new"}
    if not new:
        return []
    low, high = new[min(new)], new[max(new)]
    out = [f"steady round at {high['ranks']} ranks: {high['round_cpu_ms']:.4f} ms "
           f"(<= {TARGET_ROUND_CPU_MS} ms and <= 2x the {low['ranks']}-rank "
           f"{low['round_cpu_ms']:.4f} ms: "
           + ("met" if high["round_cpu_ms"] <= min(TARGET_ROUND_CPU_MS, 2 * low["round_cpu_ms"])
              else "missed") + ")",
           f"round bytes per rank at {high['ranks']}: {high['round_bytes_per_rank']} "
           f"({high['round_bytes_per_rank'] / low['round_bytes_per_rank']:.2f}x the "
           f"{low['ranks']}-rank figure; target <= 2x: "
           + ("met" if high["round_bytes_per_rank"] <= 2 * low["round_bytes_per_rank"]
              else "missed") + ")",
           f"first step at {high['ranks']}: {high['first_step_cpu_s']:.4f} s CPU per rank "
           f"(<= {TARGET_FIRST_STEP_S} s: "
           + ("met" if high["first_step_cpu_s"] <= TARGET_FIRST_STEP_S else "missed") + ")"]
    return out


def plot(rows: List[Dict], path: str) -> None:
    with figure(path, 1, 3, figsize=(15, 4.5), dpi=110) as (fig, axes):
        for design, style in (("old", "o--"), ("new", "s-")):
            mine = [r for r in rows if r["design"] == design]
            if not mine:
                continue
            fields = ("round_cpu_ms", "round_bytes_per_rank", "first_step_cpu_s")
            for ax, field in zip(axes, fields):
                pts = [(r["ranks"], r[field]) for r in mine if r[field] is not None]
                if pts:
                    ax.plot(*zip(*pts), style, label=design)
        titles = ("steady round, CPU per rank (ms)", "steady round, bytes per rank",
                  "first step of ResNet-50 (214 names), CPU per rank (s)")
        for ax, title in zip(axes, titles):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("simulated ranks")
            ax.set_title(title, fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        fig.suptitle("hvdlike control plane: the real negotiation code, P ranks simulated in one "
                     "process")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="2,128,1024,4096,16384",
                   help="comma-separated simulated world sizes")
    p.add_argument("--rounds", type=int, default=200, help="steady rounds measured per case")
    p.add_argument("--old-commit", default=None,
                   help=f"also measure the design at this commit (e.g. {DEFAULT_OLD_COMMIT})")
    p.add_argument("--old-first-step-ranks", type=int, default=1024,
                   help="run the old design's first step up to this many ranks")
    p.add_argument("--alpha-us", type=float, default=2.0,
                   help="latency per message step for projected_round_us (RDMA-class NIC)")
    p.add_argument("--link-gbit", type=float, default=100.0,
                   help="link speed for projected_round_us")
    p.add_argument("--json", default="results/control_plane/bench_control_plane.json")
    p.add_argument("--png", default=None, help="default: the JSON's path with .png")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.ranks.split(",")]
    if any(s < 1 for s in sizes):
        p.error("--ranks takes positive world sizes")
    old = load_old(args.old_commit) if args.old_commit else None
    print(HEADER)
    rows = measure(sizes, args.rounds, old, args.old_first_step_ranks)
    print(f"\nprojected steady round (CPU + alpha-beta, alpha {args.alpha_us:g} us, "
          f"{args.link_gbit:g} Gbit/s):")
    for row in rows:
        row["projected_round_us"] = projected_round_us(row, args.alpha_us, args.link_gbit)
        print(f"  {row['design']:>3} {row['ranks']:>6} ranks: {row['projected_round_us']:9.1f} us")
    verdicts = targets(rows)
    print("\n".join(verdicts))
    meta = dict(vector_bytes=Negotiation(2, CAPACITY, lambda s: range(2)).vector_bytes,
                cache_capacity=CAPACITY, slots=negotiation.SLOTS, rounds=args.rounds,
                alpha_us=args.alpha_us, link_gbit=args.link_gbit,
                old_commit=args.old_commit, host=os.uname().nodename,
                cpu_count=os.cpu_count(), python=sys.version.split()[0],
                date=time.strftime("%Y-%m-%d"))
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    write_json(args.json, {"rows": rows, "targets": verdicts, "meta": meta})
    png = args.png or os.path.splitext(args.json)[0] + ".png"
    plot(rows, png)
    print(f"wrote {args.json} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
