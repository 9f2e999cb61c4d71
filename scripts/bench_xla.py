#!/usr/bin/env python
"""XLA with a DistributedOptimizer: Keras 3 ``fit`` with ``jit_compile=True`` against
``jit_compile=False``, at np=1 and np=2.

Run on one node, not under MPI (it starts the jobs itself)::

    python scripts/bench_xla.py [--nps 1 2] [--repeats 7] [--steps 20] [--depth 48]
        [--out results/xla] [--no-plot]

The model is one where XLA pays on a CPU: 48 elementwise layers (a learned scale and shift,
then ``x + 0.1 * h * sigmoid(h)``) of width 512 and a dense head, Adam, batch 128 per rank;
TensorFlow runs each of those small ops as a kernel of its own, XLA fuses them. Each job
builds the model twice, with and without XLA, both with ``hvd.DistributedOptimizer``, and
times ``--repeats`` fits of ``--steps`` steps each, alternating the two; a job's gain is the
median step time without XLA over the median with it. Writes OUT/bench_xla.json and
OUT/bench_xla.png; exits non-zero if a job fails.
"""
import argparse
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

from bench_output import figure, markdown_table, run_json_job, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
WIDTH, BATCH = 512, 128


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nps", type=int, nargs="+", default=[1, 2], help="ranks per job")
    p.add_argument("--repeats", type=int, default=7, help="timed fits per setting")
    p.add_argument("--steps", type=int, default=20, help="steps per timed fit")
    p.add_argument("--depth", type=int, default=48, help="elementwise layers (default 48)")
    p.add_argument("--out", default="results/xla", help="output directory")
    p.add_argument("--timeout", type=float, default=900, help="seconds per job")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # a job's JSON (run under MPI)
    args = p.parse_args(argv)
    if min(args.nps) < 1 or min(args.repeats, args.steps, args.depth) < 1:
        p.error("need --nps, --repeats, --steps and --depth >= 1")
    return args


def worker(args: argparse.Namespace) -> None:
    """One job: both settings timed, alternated; rank 0 writes the medians."""
    import numpy as np
    import hvdlike.tensorflow.keras as hvd
    from hvdlike.tensorflow import compat
    keras = compat.keras()
    hvd.init()

    class Gated(keras.layers.Layer):
        def build(self, shape: Any) -> None:
            self.w = self.add_weight(shape=(shape[-1],), initializer="ones")
            self.b = self.add_weight(shape=(shape[-1],), initializer="zeros")

        def call(self, x: Any) -> Any:
            h = x * self.w + self.b
            return x + 0.1 * h * keras.ops.sigmoid(h)

    def build(jit: bool) -> Any:
        keras.utils.set_random_seed(0)
        inputs = keras.Input((WIDTH,))
        h = inputs
        for _ in range(args.depth):
            h = Gated()(h)
        model = keras.Model(inputs, keras.layers.Dense(10)(h))
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3)),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=jit)
        return model

    rng = np.random.default_rng(hvd.rank())
    x = rng.random((BATCH * args.steps, WIDTH), dtype=np.float32)
    y = rng.integers(0, 10, len(x))
    models = {"off": build(False), "on": build(True)}
    for model in models.values():  # traced and compiled
        model.fit(x[:BATCH * 3], y[:BATCH * 3], batch_size=BATCH, verbose=0)
    times: Dict[str, List[float]] = {"off": [], "on": []}
    for i in range(args.repeats):
        for setting in (("off", "on") if i % 2 == 0 else ("on", "off")):
            hvd.barrier()
            start = time.perf_counter()
            models[setting].fit(x, y, batch_size=BATCH, verbose=0, shuffle=False)
            times[setting].append((time.perf_counter() - start) / args.steps * 1e3)
    same = [float(np.abs(a - b).max()) for a, b in
            zip(models["off"].get_weights(), models["on"].get_weights())]
    if hvd.rank() == 0:
        write_json(args.worker, {"np": hvd.size(), "step_ms": times,
                                 "max_weight_difference": max(same)})


def run_job(args: argparse.Namespace, np_: int) -> Dict[str, Any]:
    out = os.path.join(args.out, f"np{np_}.json")
    cmd = [sys.executable, "-m", "hvdlike.runner", "-np", str(np_), sys.executable,
           os.path.abspath(__file__), "--worker", out, "--repeats", str(args.repeats),
           "--steps", str(args.steps), "--depth", str(args.depth)]
    print(f"bench_xla: np={np_}", flush=True)
    return run_json_job(cmd, out, f"bench_xla: the np={np_} job", args.timeout)


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    jobs = [run_job(args, n) for n in args.nps]
    rows = []
    for job in jobs:
        off, on = (statistics.median(job["step_ms"][s]) for s in ("off", "on"))
        job.update(median_ms={"off": off, "on": on}, gain=off / on)
        rows.append([job["np"], f"{off:.1f}", f"{on:.1f}", f"{off / on:.2f}x",
                     f"{job['max_weight_difference']:.1e}"])
    print(markdown_table(["np", "step, jit_compile=False (ms)", "step, jit_compile=True (ms)",
                          "XLA gain", "max weight difference"], rows))
    meta = {"depth": args.depth, "width": WIDTH, "batch_per_rank": BATCH, "steps": args.steps,
            "repeats": args.repeats, "cpus": os.cpu_count()}
    write_json(os.path.join(args.out, "bench_xla.json"), {"meta": meta, "jobs": jobs})
    if not args.no_plot:
        with figure(os.path.join(args.out, "bench_xla.png"), figsize=(6, 3.5)) as (fig, ax):
            nps = [str(j["np"]) for j in jobs]
            width = 0.38
            for k, (setting, label) in enumerate((("off", "jit_compile=False"),
                                                 ("on", "jit_compile=True"))):
                ax.bar([i + (k - 0.5) * width for i in range(len(jobs))],
                       [j["median_ms"][setting] for j in jobs], width, label=label)
            ax.set_xticks(range(len(jobs)), [f"np={n}" for n in nps])
            ax.set_ylabel("ms per step (median)")
            ax.set_title("Keras fit with DistributedOptimizer: XLA on and off")
            ax.legend()


if __name__ == "__main__":
    main()
