"""``hvdlike-timeline``: summarise hvdlike timelines: time per phase, per tensor, and how much
communication overlapped computation in each training step.

    HVDLIKE_TIMELINE=results/timeline/timeline.json hvdlikerun -np 2 python train.py
    hvdlike-timeline results/timeline/timeline.json    # or python -m hvdlike.runner.timeline_summary

Reads every rank's file (rank 0's ``timeline.json``, the others' ``timeline.rank<r>.json``)
and writes, next to them or in ``--out``:
``timeline_summary.json``, ``timeline_summary.png`` and ``timeline_merged.json`` (all ranks in
one trace, one process per rank, for chrome://tracing or ui.perfetto.dev).

``waited_for_rank_s``: how long this rank's requests waited (``WAIT_FOR_RANKS``) for each
rank that was the last to submit them: the stragglers.

Overlap of a ``STEP`` (one optimizer update; see hvdlike/engine/timeline.py): backprop has produced
its last gradient when the step's last request is submitted; communication is the union of
the step's transport phases (``SHM_*``, ``CMA_*``, ``HIERARCHICAL_*``, ``MPI_*``); hidden = the part of it before that last
submit, exposed = the rest.
"""
import argparse
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..engine.timeline import rank_file

Span = Tuple[float, float]


def is_transport(name: str) -> bool:
    return name.startswith(("SHM_", "CMA_", "HIERARCHICAL_", "MPI_"))


def load(path: str) -> Dict[int, List[Dict[str, Any]]]:
    """rank -> its events: rank 0's file is ``path``, rank r's has ``.rank<r>`` added."""
    if not os.path.isfile(path):
        raise SystemExit(f"no timeline file {path}: was HVDLIKE_TIMELINE={path}?")
    out = {}
    rank = 0
    while os.path.isfile(rank_file(path, rank)):  # every rank writes its file at the start
        text = Path(rank_file(path, rank)).read_text().rstrip()
        if not text.endswith("]"):  # a rank that stopped early: close the array
            text = text.rstrip(",") + "]"
        out[rank] = json.loads(text)
        rank += 1
    return out


def union_length(spans: List[Span]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def clip(spans: List[Span], lo: float, hi: float) -> List[Span]:
    return [(max(a, lo), min(b, hi)) for a, b in spans if min(b, hi) > max(a, lo)]


def summarise(events: List[Dict[str, Any]]) -> Dict[str, Any]:
    rows = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    tensor_spans = [e for e in spans if rows.get(e["tid"]) not in ("steps", "engine")]
    phases: Dict[str, float] = {}
    per_tensor: Dict[str, float] = {}
    waited_for: Dict[str, float] = {}  # rank -> time spent waiting while it was last
    for e in tensor_spans:
        phases[e["name"]] = phases.get(e["name"], 0.0) + e["dur"] / 1e6
        if e["name"] == "WAIT_FOR_RANKS":
            for late in e.get("args", {}).get("last_ranks", []):
                waited_for[str(late)] = waited_for.get(str(late), 0.0) + e["dur"] / 1e6
        if is_transport(e["name"]):
            row = rows[e["tid"]]
            per_tensor[row] = per_tensor.get(row, 0.0) + e["dur"] / 1e6
    transports = [(e["ts"], e["ts"] + e["dur"]) for e in tensor_spans if is_transport(e["name"])]
    submits = sorted(e["ts"] for e in tensor_spans if e["name"] == "QUEUED")
    steps = []
    for e in sorted((e for e in spans if e["name"] == "STEP"), key=lambda e: e["ts"]):
        lo, hi = e["ts"], e["ts"] + e["dur"]
        inside = [t for t in submits if lo <= t <= hi]
        comm = clip(transports, lo, hi)
        backprop_end = inside[-1] if inside else lo
        hidden = union_length(clip(comm, lo, backprop_end))
        total = union_length(comm)
        steps.append({"step_s": e["dur"] / 1e6, "communication_s": total / 1e6,
                      "hidden_s": hidden / 1e6, "exposed_s": (total - hidden) / 1e6,
                      "requests": len(inside),
                      "hidden_fraction": hidden / total if total else None})
    return {"phases_s": dict(sorted(phases.items(), key=lambda kv: -kv[1])),
            "transport_per_tensor_s": dict(sorted(per_tensor.items(), key=lambda kv: -kv[1])),
            "waited_for_rank_s": dict(sorted(waited_for.items(), key=lambda kv: -kv[1])),
            "steps": steps}


def main(argv: Optional[List[str]] = None) -> None:
    """Console entry point of ``hvdlike-timeline``."""
    p = argparse.ArgumentParser(prog="hvdlike-timeline",
                                description="Summarise hvdlike timelines: time per phase, per "
                                            "tensor, and the communication each step hid.")
    p.add_argument("path", help="the HVDLIKE_TIMELINE path (rank 0's file)")
    p.add_argument("--out", help="folder for the outputs (default: the timeline's folder)")
    p.add_argument("--top", type=int, default=15, help="tensors shown in the PNG")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out or os.path.dirname(os.path.abspath(args.path)))
    out.mkdir(parents=True, exist_ok=True)
    ranks = load(args.path)
    summary = {str(r): summarise(ev) for r, ev in sorted(ranks.items())}
    merged = [e for r in sorted(ranks) for e in ranks[r]]
    (out / "timeline_merged.json").write_text(json.dumps(merged))
    (out / "timeline_summary.json").write_text(json.dumps(summary, indent=2))
    for r, s in summary.items():
        print(f"rank {r}: time per phase (s, summed over requests)")
        for name, t in s["phases_s"].items():
            print(f"  {name:<26} {t:10.4f}")
        if s["waited_for_rank_s"]:
            print("  waited for (s, requests whose last submitter was that rank): " + ", ".join(
                f"rank {k} {t:.4f}" for k, t in s["waited_for_rank_s"].items()))
        print(f"  {'step':>4} {'step s':>8} {'comm s':>8} {'hidden s':>9} {'exposed s':>10} "
              f"{'hidden':>7} {'requests':>9}")
        for i, st in enumerate(s["steps"]):
            frac = st["hidden_fraction"]
            print(f"  {i:>4} {st['step_s']:8.3f} {st['communication_s']:8.3f} "
                  f"{st['hidden_s']:9.3f} {st['exposed_s']:10.3f} "
                  f"{'-' if frac is None else f'{100 * frac:.0f}%':>7} {st['requests']:>9}")
    print(f"wrote {out / 'timeline_summary.json'} and {out / 'timeline_merged.json'}")
    if args.no_plot:
        return
    try:
        import matplotlib
    except ImportError:
        print("no timeline_summary.png: it needs matplotlib (pip install matplotlib)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    s = summary[min(summary, key=int)]
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(15, 4.5))
    a1.barh(list(s["phases_s"]), list(s["phases_s"].values()))
    a1.invert_yaxis()
    a1.set_xlabel("seconds, summed over requests")
    a1.set_title("Time per phase (rank 0)")
    top = list(s["transport_per_tensor_s"].items())[:args.top]
    a2.barh([k[:30] for k, _ in top], [v for _, v in top])
    a2.invert_yaxis()
    a2.set_xlabel("seconds on the transport")
    a2.set_title(f"Top {len(top)} requests by transport time")
    xs = range(len(s["steps"]))
    a3.bar(xs, [st["hidden_s"] for st in s["steps"]], label="hidden (during backprop)")
    a3.bar(xs, [st["exposed_s"] for st in s["steps"]],
           bottom=[st["hidden_s"] for st in s["steps"]], label="exposed (after backprop)")
    step_times = [st["step_s"] for st in s["steps"]]
    a3.plot(xs, step_times, "k.", label="step time")
    if step_times:  # the first step also traced the model: keep the others readable
        typical = sorted(step_times)[len(step_times) // 2]
        top = max([1.5 * typical] + [st["communication_s"] for st in s["steps"]])
        a3.set_ylim(0, 1.05 * top)
    a3.set_xlabel("step")
    a3.set_ylabel("seconds")
    a3.set_title("Communication per step")
    a3.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "timeline_summary.png", dpi=100)
    print(f"wrote {out / 'timeline_summary.png'}")


if __name__ == "__main__":
    main()
