#!/usr/bin/env python
"""Past this machine, on paper: an alpha-beta model of hvdlike's all-reduce, fitted to
scripts/bench_cluster.py's figures, predicting all-reduce time and ResNet-50 scaling for 8 to
1,024 hosts::

    python scripts/model_allreduce.py [--bench results/bench_cluster/bench_cluster.json] \
        [--out results/model_allreduce/model_allreduce]

Fitted per measured series (link, layout, algorithm): t(n) = a + b * n, a from the small
sizes and b from the large ones (``fit``). From those:

* alpha, the cost of one message step across the network: a / (2(P-1)) of raw MPI on
  2 hosts x 1 rank over the 1 Gbit/s link (P = 2 ranks);
* o, hvdlike's own cost per bucket (the engine's round, the handle): a of hvdlike minus a of
  raw MPI in the same run;
* e, the fraction of the line rate each algorithm reaches: 2(H-1)/H / (b * B) of hvdlike on
  the shaped 1 Gbit/s link (B its measured TCP line rate), 2 hosts x 2 ranks.

The model, for H hosts of L ranks, a bucket of f bytes and a link of B bytes/s (both
algorithms put the two-level minimum, 2(H-1)/H f, on each host's link, as measured):

* flat, one MPI_Allreduce over P = H*L ranks, as recursive halving and doubling
  (Rabenseifner's, what MPI libraries run for large messages):
  t = o + 2 log2(P) alpha + 2(H-1)/H f / (e_flat B) + f / M_mpi
* hierarchical: shared memory in the node, then MPI over the H hosts per local rank:
  t = o + 2 log2(H) alpha + 2(H-1)/H f / (e_hier B) + f / M_shm

M_mpi and M_shm are the on-node all-reduce rates measured here at 64 MiB, 2 ranks (1.35 and
2.8 GB/s); the on-node and network parts are added, not overlapped.

ResNet-50: 25.6 M float32 gradients (102 MB), L = 8 GPUs per host, a step of T = 0.2 s per GPU
(batch 64 on a V100-class GPU); backprop is 2/3 of it, and with overlap only what does not fit
in it is exposed, never less than the last bucket. Scaling efficiency = T / (T + exposed).
Writes OUT.json (fit, predictions, chosen algorithm and fusion size) and OUT.png.
"""
import argparse
import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
from bench_output import figure

REPO = Path(__file__).resolve().parents[1]
GBIT = 1e9 / 8  # bytes/s of 1 Gbit/s
# on-node all-reduce rates at 64 MiB, 2 ranks, this machine (docs/benchmarks.md, GUIDE.md):
MPI_ON_NODE = 1.35e9  # bytes/s, MPI_Allreduce
SHM_ON_NODE = 2.8e9  # bytes/s, hvdlike's shared-memory transport (2.1x MPI_Allreduce)
RESNET50_BYTES = 25_557_032 * 4
STEP_S, BACKPROP_SHARE, GPUS_PER_HOST = 0.2, 2 / 3, 8
FUSION_SIZES = [1 << 20, 4 << 20, 16 << 20, 64 << 20]
HOSTS = [8, 16, 32, 64, 128, 256, 512, 1024]
LINKS_GBIT = [10, 25, 100]


def fit(points: List[Tuple[float, float]]) -> Tuple[float, float]:
    """(a, b) of t = a + b n: a, the median time of the sizes up to 16 KiB (latency-bound); b,
    the median of (t - a) / n over the sizes from 4 MiB (bandwidth-bound). Medians, because
    single calls on a shared 2-core machine have outliers."""
    a = float(np.median([t for n, t in points if n <= 16384]))
    b = float(np.median([(t - a) / n for n, t in points if n >= 4 << 20]))
    return a, b


def series(results: List[Dict[str, Any]], link: str, layout: str, algorithm: str,
           which: str) -> List[Tuple[float, float]]:
    return [(r["bytes"], r["time_s"]) for r in results if r["link"] == link and
            r["layout"] == layout and r["algorithm"] == algorithm and r["series"] == which]


def parameters(bench: Dict[str, Any]) -> Dict[str, Any]:
    results = bench["results"]
    rate = next(r["line_rate"] for r in results if r["link"] == "1gbit")
    raw_a, raw_b = fit(series(results, "1gbit", "2x1", "flat", "raw"))
    flat_a, flat_b = fit(series(results, "1gbit", "2x1", "flat", "hvdlike"))
    _, flat_b = fit(series(results, "1gbit", "2x2", "flat", "hvdlike"))
    hier_a, hier_b = fit(series(results, "1gbit", "2x2", "hierarchical", "hvdlike"))
    fits = {}
    for r in results:
        key = f"{r['link']} {r['layout']} {r['algorithm']} {r['series']}"
        if key not in fits:
            a, b = fit(series(results, r["link"], r["layout"], r["algorithm"], r["series"]))
            fits[key] = {"a_ms": a * 1e3, "b_ns_per_byte": b * 1e9,
                         "rate_MiB_s": 1 / b / 2**20 if b > 0 else None}
    return {"alpha_s": raw_a / 2, "overhead_s": max(flat_a - raw_a, 0.0),
            "e_flat": 1 / (flat_b * rate), "e_hier": 1 / (hier_b * rate),
            "line_rate_1gbit": rate, "fits": fits}


def allreduce_time(p: Dict[str, Any], algorithm: str, hosts: int, per_host: int, f: float,
                   link: float) -> float:
    if algorithm == "flat":
        ranks = hosts * per_host
        return (p["overhead_s"] + 2 * np.log2(ranks) * p["alpha_s"]
                + 2 * (hosts - 1) / hosts * f / (p["e_flat"] * link) + f / MPI_ON_NODE)
    return (p["overhead_s"] + 2 * np.log2(hosts) * p["alpha_s"]
            + 2 * (hosts - 1) / hosts * f / (p["e_hier"] * link) + f / SHM_ON_NODE)


def step_exposed(p: Dict[str, Any], algorithm: str, hosts: int, f: float, link: float) -> float:
    """Communication time a ResNet-50 step waits for, with overlap, buckets of f bytes."""
    buckets = int(np.ceil(RESNET50_BYTES / f))
    last = RESNET50_BYTES - (buckets - 1) * f
    total = ((buckets - 1) * allreduce_time(p, algorithm, hosts, GPUS_PER_HOST, f, link)
             + allreduce_time(p, algorithm, hosts, GPUS_PER_HOST, last, link))
    return max(total - BACKPROP_SHARE * STEP_S,
               allreduce_time(p, algorithm, hosts, GPUS_PER_HOST, last, link))


def predict(p: Dict[str, Any]) -> List[Dict[str, Any]]:
    rows = []
    for gbit in LINKS_GBIT:
        link = gbit * GBIT
        for hosts in HOSTS:
            best = None
            for algorithm in ("flat", "hierarchical"):
                for f in FUSION_SIZES:
                    exposed = step_exposed(p, algorithm, hosts, f, link)
                    row = {"link_gbit": gbit, "hosts": hosts, "algorithm": algorithm,
                           "fusion_bytes": f, "exposed_s": exposed,
                           "efficiency": STEP_S / (STEP_S + exposed),
                           "no_overlap_efficiency": STEP_S / (STEP_S + allreduce_time(
                               p, algorithm, hosts, GPUS_PER_HOST, RESNET50_BYTES, link)),
                           "allreduce_102MB_s": allreduce_time(
                               p, algorithm, hosts, GPUS_PER_HOST, RESNET50_BYTES, link)}
                    rows.append(row)
                    # hierarchical only where it is clearly better (1% of the step): flat
                    # is one MPI call and the MPI library's own tuning
                    margin = 0.01 * STEP_S if algorithm == "hierarchical" else 0.0
                    if best is None or exposed < best["exposed_s"] - margin:
                        best = row
            assert best is not None
            best["best"] = True
    return rows


def plot(rows: List[Dict[str, Any]], path: str) -> None:

    with figure(path, 1, 2, figsize=(11, 4), dpi=110) as (fig, (left, right)):
        colors = dict(zip(LINKS_GBIT, ("tab:red", "tab:blue", "tab:green")))
        for gbit in LINKS_GBIT:
            for algorithm, style in (("flat", "--"), ("hierarchical", "-")):
                mine = [r for r in rows if r["link_gbit"] == gbit and r["algorithm"] == algorithm
                        and r["fusion_bytes"] == 64 << 20]
                left.plot([r["hosts"] for r in mine], [r["allreduce_102MB_s"] * 1e3 for r in mine],
                          style, color=colors[gbit], label=f"{gbit} Gbit/s {algorithm}")
                best = [max((r for r in rows if r["link_gbit"] == gbit and r["hosts"] == h
                             and r["algorithm"] == algorithm), key=lambda r: r["efficiency"])
                        for h in HOSTS]
                right.plot(HOSTS, [r["efficiency"] for r in best], style, color=colors[gbit],
                           label=f"{gbit} Gbit/s {algorithm}")
        left.set(xscale="log", yscale="log", xlabel="hosts (8 ranks each)",
                 ylabel="ms per 102 MB all-reduce (64 MiB buckets)",
                 title="all-reduce of ResNet-50's gradients")
        right.set(xscale="log", xlabel="hosts (8 GPUs each)", ylim=(0, 1.05),
                  ylabel="scaling efficiency (best fusion size, overlap)",
                  title="ResNet-50, 0.2 s per step per GPU")
        for ax in (left, right):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", default=str(REPO / "results/bench_cluster/bench_cluster.json"))
    ap.add_argument("--out", default=str(REPO / "results/model_allreduce/model_allreduce"))
    args = ap.parse_args()
    p = parameters(json.loads(Path(args.bench).read_text()))
    rows = predict(p)
    print(f"alpha {p['alpha_s'] * 1e6:.0f} us per step, hvdlike overhead "
          f"{p['overhead_s'] * 1e6:.0f} us per bucket, link efficiency flat {p['e_flat']:.2f}, "
          f"hierarchical {p['e_hier']:.2f}")
    print("| link | hosts | best | fusion | efficiency (overlap) | flat 102 MB | "
          "hierarchical 102 MB |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if r.get("best"):
            flat, hier = (next(x for x in rows if x["link_gbit"] == r["link_gbit"] and
                               x["hosts"] == r["hosts"] and x["algorithm"] == a)
                          for a in ("flat", "hierarchical"))
            print(f"| {r['link_gbit']} Gbit/s | {r['hosts']} | {r['algorithm']} | "
                  f"{r['fusion_bytes'] >> 20} MiB | {r['efficiency']:.2f} | "
                  f"{flat['allreduce_102MB_s'] * 1e3:.0f} ms | "
                  f"{hier['allreduce_102MB_s'] * 1e3:.0f} ms |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps({"parameters": p, "predictions": rows},
                                                   indent=1))
    plot(rows, args.out + ".png")
    print(f"wrote {args.out}.json and {args.out}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
