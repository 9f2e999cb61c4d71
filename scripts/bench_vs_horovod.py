#!/usr/bin/env python
"""hvdlike's TensorFlow collectives beside Horovod's: the same calls, jobs alternated.

Run on one node, not under MPI (it starts the jobs itself)::

    python scripts/bench_vs_horovod.py [--horovod-python VENV/bin/python] [--np 2]
        [--pairs 2] [--out results/vs_horovod] [--no-plot]

Each job times, with ``op=Sum`` on float32 TensorFlow CPU tensors and the library's
defaults: eager ``allreduce`` of 1 KiB, 1 MiB, 16 MiB and 64 MiB (calls back to back, the
median over batches of the time per call), and ResNet-50's 214 gradients (102 MB) as one
``grouped_allreduce`` eagerly, the same inside a ``tf.function``, and one ``allreduce`` per
tensor inside one ``tf.function`` (how Horovod users write custom loops; median step). Every
result is checked against NumPy once before timing. The hvdlike job runs under
``hvdlikerun``; with ``--horovod-python`` (a Python whose ``horovod.tensorflow`` is built
with MPI, e.g. a venv's) a Horovod job runs under that venv's ``mpirun`` after each hvdlike
one, ``--pairs`` times. Reported: each library's median over its jobs, and hvdlike's time
over its own grouped call (the per-tensor ratio) and over Horovod's. Writes
OUT/bench_vs_horovod.json and OUT/bench_vs_horovod.png; exits non-zero if a job fails.
"""
import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional

from bench_output import figure, markdown_table, run_json_job, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = {"eager 1 KiB": 1 << 10, "eager 1 MiB": 1 << 20, "eager 16 MiB": 16 << 20,
         "eager 64 MiB": 64 << 20}
STEPS = ("resnet50 grouped eager", "resnet50 grouped tf.function",
         "resnet50 per-tensor tf.function")
ROWS = tuple(SIZES) + STEPS


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--horovod-python", help="a Python with horovod.tensorflow (MPI build)")
    p.add_argument("--np", type=int, default=2, help="ranks per job (default 2)")
    p.add_argument("--pairs", type=int, default=2, help="jobs per library (default 2)")
    p.add_argument("--repeats", type=int, default=9, help="timed batches or steps per row")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply the ResNet-50 tensors' sizes (smoke runs; default 1)")
    p.add_argument("--out", default="results/vs_horovod", help="output directory")
    p.add_argument("--timeout", type=float, default=900, help="seconds per job")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--worker", choices=("hvdlike", "horovod"), help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)  # a worker job's output
    args = p.parse_args(argv)
    if args.np < 2 or args.pairs < 1 or args.repeats < 1 or args.scale <= 0:
        p.error("need --np >= 2, --pairs >= 1, --repeats >= 1, --scale > 0")
    return args


def worker(args: argparse.Namespace) -> None:
    """One job: every row timed with this library; rank 0 writes the medians (ms)."""
    import numpy as np
    import tensorflow as tf
    if args.worker == "horovod":
        import horovod.tensorflow as hvd
    else:
        import hvdlike.tensorflow as hvd
    from resnet50 import resnet50_shapes
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    tf.config.threading.set_intra_op_parallelism_threads(1)

    def check(got: Any, sent: List[Any], what: str) -> None:
        """``got`` is the sum of ``sent`` over the ranks (every rank sends the same)."""
        got = got if isinstance(got, (list, tuple)) else [got]
        for g, s in zip(got, sent):
            if not np.allclose(np.asarray(g), np.asarray(s) * size):
                raise SystemExit(f"bench_vs_horovod: {what}: wrong result on rank {rank}")

    def per_call(call: Callable[[], Any], iters: int) -> float:
        for _ in range(max(2, iters // 5)):
            call()
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            for _ in range(iters):
                call()
            times.append((time.perf_counter() - start) / iters * 1e3)
        return statistics.median(times)

    results: Dict[str, float] = {}
    for row, nbytes in SIZES.items():
        x = tf.ones([nbytes // 4])
        check(hvd.allreduce(x, op=hvd.Sum), [x], row)
        results[row] = per_call(lambda: hvd.allreduce(x, op=hvd.Sum),
                                max(4, min(500, (16 << 20) // nbytes)))
    shapes = [s[:-1] + (max(1, round(s[-1] * args.scale)),) for s in resnet50_shapes()]
    grads = [tf.fill(s, float(i % 7 + 1)) for i, s in enumerate(shapes)]
    grouped_fn = tf.function(lambda ts: hvd.grouped_allreduce(ts, op=hvd.Sum))
    per_tensor_fn = tf.function(lambda ts: [hvd.allreduce(t, op=hvd.Sum) for t in ts])
    steps = {STEPS[0]: lambda: hvd.grouped_allreduce(grads, op=hvd.Sum),
             STEPS[1]: lambda: grouped_fn(grads), STEPS[2]: lambda: per_tensor_fn(grads)}
    for row, step in steps.items():
        check(step(), grads, row)
        results[row] = per_call(step, 1)
    if rank == 0:
        with open(args.json, "w") as f:
            json.dump({"library": args.worker, "np": size, "tensorflow": tf.__version__,
                       "ms": results}, f)


def run_job(args: argparse.Namespace, library: str, pair: int) -> Dict[str, Any]:
    out = os.path.join(args.out, f"{library}_{pair}.json")
    script = [os.path.abspath(__file__), "--worker", library, "--json", out, "--repeats",
              str(args.repeats), "--scale", str(args.scale)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if library == "hvdlike":
        cmd = [sys.executable, "-m", "hvdlike.runner", "-np", str(args.np), sys.executable]
    else:  # the same launch hvdlikerun makes, with the Horovod venv's own Open MPI
        python = os.path.abspath(args.horovod_python)
        cmd = [os.path.join(os.path.dirname(python), "mpirun"), "-np", str(args.np),
               "--bind-to", "none", python]
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_osc="^ucx")
    print(f"bench_vs_horovod: {library}, job {pair + 1}", flush=True)
    return run_json_job(cmd + script, out, f"bench_vs_horovod: the {library} job",
                        args.timeout, env)


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    os.makedirs(args.out, exist_ok=True)
    libraries = ["hvdlike"] + (["horovod"] if args.horovod_python else [])
    jobs: Dict[str, List[Dict[str, Any]]] = {lib: [] for lib in libraries}
    for pair in range(args.pairs):
        for lib in libraries:
            jobs[lib].append(run_job(args, lib, pair))
    ms = {lib: {row: statistics.median(j["ms"][row] for j in jobs[lib]) for row in ROWS}
          for lib in libraries}
    grouped = ms["hvdlike"][STEPS[1]]
    header = ["call (np=%d)" % args.np] + [f"{lib}, ms" for lib in libraries]
    header += ["hvdlike / Horovod"] if "horovod" in ms else []
    rows = []
    for row in ROWS:
        cells = [row] + [f"{ms[lib][row]:.3f}" for lib in libraries]
        if "horovod" in ms:
            cells.append(f"{ms['hvdlike'][row] / ms['horovod'][row]:.2f}x")
        rows.append(cells)
    print(markdown_table(header, rows))
    per_tensor = ms["hvdlike"][STEPS[2]] / grouped
    print(f"hvdlike: one allreduce per tensor in a tf.function / grouped in a tf.function = "
          f"{per_tensor:.2f}x")
    write_json(os.path.join(args.out, "bench_vs_horovod.json"),
               {"np": args.np, "pairs": args.pairs, "repeats": args.repeats,
                "scale": args.scale, "median_ms": ms, "per_tensor_over_grouped": per_tensor,
                "jobs": jobs})
    if not args.no_plot:
        with figure(os.path.join(args.out, "bench_vs_horovod.png"),
                    figsize=(8, 4)) as (fig, ax):
            width = 0.8 / len(libraries)
            for k, lib in enumerate(libraries):
                ax.bar([i + (k - (len(libraries) - 1) / 2) * width for i in range(len(ROWS))],
                       [ms[lib][row] for row in ROWS], width, label=lib)
            ax.set_xticks(range(len(ROWS)), [r.replace(" ", "\n") for r in ROWS], fontsize=7)
            ax.set_yscale("log")
            ax.set_ylabel("ms (median)")
            ax.set_title(f"TensorFlow collectives, np={args.np}, op=Sum, float32")
            ax.legend()


if __name__ == "__main__":
    main()
