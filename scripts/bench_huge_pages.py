#!/usr/bin/env python
"""Huge pages for TensorFlow's memory: the gradient all-reduce with and without glibc's advice.

Run on one node, not under MPI (it starts the jobs itself)::

    python scripts/bench_huge_pages.py [--np 2] [--pairs 2] [--repeats 7] [--scale 1.0]
        [--out results/huge_pages] [--no-plot]

With ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (glibc 2.35 and later) glibc asks for
transparent huge pages for the memory it maps for large allocations, TensorFlow's tensors
among them, which otherwise sit on 4 KiB pages where THP is "madvise". This runs
``scripts/bench_fusion.py --tf`` (the ResNet-50 gradient set, NumPy and TensorFlow variants)
under ``hvdlikerun -np N`` ``--pairs`` times with ``glibc.malloc.hugetlb=0`` (off) and ``=1``
(on) as the jobs' ``GLIBC_TUNABLES``, alternating which goes first, and compares the median
step times of the variants
whose inputs the setting can move (grouped: NumPy's own tensors; tf_function, tf_eager:
TensorFlow's). A pair's ratio is off / on of one job each; reported is the median over pairs,
with the share of TensorFlow's inputs on huge pages in each setting. Writes
OUT/bench_huge_pages.json and OUT/bench_huge_pages.png; exits non-zero if a job fails.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Dict, List, Optional
from bench_output import figure, markdown_table, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
COMPARED = ("grouped", "tf_function", "tf_eager", "flat")
SETTINGS = {"off": "glibc.malloc.hugetlb=0", "on": "glibc.malloc.hugetlb=1"}  # GLIBC_TUNABLES


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=int, default=2, help="ranks per job (default 2)")
    p.add_argument("--pairs", type=int, default=2, help="jobs per setting (default 2)")
    p.add_argument("--repeats", type=int, default=7, help="bench_fusion --repeats (default 7)")
    p.add_argument("--scale", type=float, default=1.0, help="bench_fusion --scale (default 1)")
    p.add_argument("--out", default="results/huge_pages", help="output directory")
    p.add_argument("--timeout", type=float, default=900, help="seconds per job (default 900)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    args = p.parse_args(argv)
    if args.np < 2 or args.pairs < 1 or args.repeats < 1 or args.scale <= 0:
        p.error("need --np >= 2, --pairs >= 1, --repeats >= 1, --scale > 0")
    return args


def run_job(args: argparse.Namespace, setting: str, pair: int) -> Dict:
    """One bench_fusion job with ``setting``; its JSON."""
    out = os.path.join(args.out, f"{setting}_{pair}")
    cmd = [sys.executable, "-m", "hvdlike.runner", "-np", str(args.np), sys.executable,
           os.path.join(HERE, "bench_fusion.py"), "--tf", "--no-plot", "--out", out,
           "--repeats", str(args.repeats), "--scale", str(args.scale)]
    env = dict(os.environ, GLIBC_TUNABLES=SETTINGS[setting])
    print(f"bench_huge_pages: pair {pair}, huge pages {setting}", flush=True)
    done = subprocess.run(cmd, env=env, timeout=args.timeout, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-5000:])
        raise SystemExit(f"bench_huge_pages: the job with huge pages {setting} failed "
                         f"(exit {done.returncode})")
    with open(os.path.join(out, f"bench_fusion_np{args.np}.json")) as f:
        return json.load(f)


def summarize(jobs: Dict[str, List[Dict]]) -> Dict[str, Dict]:
    """Per compared variant: each setting's medians, and the median over pairs of off / on."""
    rows = {}
    for v in COMPARED:
        ms = {s: [1e3 * j["results"][v]["median_s"] for j in jobs[s]] for s in SETTINGS}
        ratios = [off / on for off, on in zip(ms["off"], ms["on"])]
        rows[v] = {"off_ms": ms["off"], "on_ms": ms["on"], "off_over_on": ratios,
                   "median_off_over_on": statistics.median(ratios)}
    return rows


def table(rows: Dict[str, Dict], pages: Dict[str, List[float]]) -> str:
    lines = [markdown_table(
        ["variant", "off ms (per job)", "on ms (per job)", "off / on (median)"],
        [[v, ", ".join(f"{x:.1f}" for x in r["off_ms"]), ", ".join(f"{x:.1f}" for x in r["on_ms"]),
          f"{r['median_off_over_on']:.3f}"] for v, r in rows.items()]), ""]
    lines.append("TensorFlow's inputs on huge pages: " + "; ".join(
        f"{s}: {', '.join(f'{x:.0%}' for x in v)}" for s, v in pages.items()))
    return "\n".join(lines)


def plot(rows: Dict[str, Dict], title: str, path: str) -> None:

    with figure(path, figsize=(7, 4.5), dpi=120) as (fig, ax):
        width = 0.38
        for k, (setting, color) in enumerate((("off", "tab:gray"), ("on", "tab:blue"))):
            xs = [i + (k - 0.5) * width for i in range(len(rows))]
            ys = [statistics.median(r[f"{setting}_ms"]) for r in rows.values()]
            bars = ax.bar(xs, ys, width, color=color, label=f"huge pages {setting}")
            ax.bar_label(bars, fmt="%.1f", fontsize=8)
        ax.set_xticks(range(len(rows)), list(rows))
        ax.set_ylabel("median step time (ms), median over jobs")
        ax.set_title(title, fontsize=9)
        ax.legend()
        ax.grid(True, axis="y", alpha=0.3)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    jobs: Dict[str, List[Dict]] = {s: [] for s in SETTINGS}
    for pair in range(args.pairs):
        for setting in (("off", "on") if pair % 2 == 0 else ("on", "off")):
            jobs[setting].append(run_job(args, setting, pair))
    rows = summarize(jobs)
    pages = {s: [j["inputs_on_huge_pages"]["tf_function"] for j in jobs[s]] for s in SETTINGS}
    meta = dict(jobs["on"][0]["metadata"], argv=sys.argv, pairs=args.pairs,
                huge_page_method=jobs["on"][0]["huge_page_method"])
    print()
    print(table(rows, pages))
    base = os.path.join(args.out, "bench_huge_pages")
    write_json(base + ".json", {"metadata": meta, "results": rows,
                                "tf_inputs_on_huge_pages": pages,
                                "table_markdown": table(rows, pages)})
    written = [base + ".json"]
    if not args.no_plot:
        plot(rows, f"ResNet-50 gradients all-reduce, np={args.np}, {meta['hostname']}: "
                   "GLIBC_TUNABLES=glibc.malloc.hugetlb=0 (off), =1 (on)", base + ".png")
        written.append(base + ".png")
    print(f"wrote {', '.join(written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
