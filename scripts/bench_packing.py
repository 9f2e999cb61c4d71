"""Packing benchmark: a training step whose small gradients cross into Python packed (one flat
tensor per dtype, hvdlike.tensorflow.packing) against the same step with each crossing alone.

    hvdlikerun -np 2 python scripts/bench_packing.py                # the tape loop
    hvdlikerun -np 2 python scripts/bench_packing.py --loop fit

On bench_train's 48-layer MLP (96 gradients, 0.97 MB; batch ``--batch-size`` per rank, 1
intra-op thread), three steps are built in one job: plain (a tf.GradientTape or optimizer),
distributed with packing, and distributed with packing off (``PACK_BYTES = 0`` while that step
is traced). They run alternately, ``--repeats`` times ``--steps`` steps each; a repeat's time
is its slowest rank's. ``--loop tape``: bench_train's ``tf.function`` step with a
DistributedGradientTape, timed whole; ``--loop fit``: Keras ``fit`` with DistributedOptimizer,
timed from its ``--skip``-th step to its last (a ``fit`` call starts slowly). Prints a table
(median and best ms a step, and packed / unpacked per repeat: median and quartiles); rank 0
writes ``OUT.json`` and ``OUT.png``.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdlike as core  # noqa: E402
import hvdlike.keras as hvd  # noqa: E402
import hvdlike.tensorflow as hvd_tf  # noqa: E402
from hvdlike.tensorflow import packing  # noqa: E402
from hvdlike.tensorflow.compat import keras as _keras  # noqa: E402
from bench_train import build_model, tape_loop  # noqa: E402
from bench_output import figure  # noqa: E402

KINDS = ("plain", "packed", "unpacked")


def fit_loop(keras, model, opt, loss, ds, skip):
    """``run(steps)``: one ``fit`` call of ``steps`` steps; returns the seconds from the start
    of step ``skip`` to the end of the last, per step."""
    model.compile(optimizer=opt, loss=loss)

    class Clock(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == skip:
                self.start = time.perf_counter()

    def run(steps):
        clock = Clock()
        model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[clock])
        return (time.perf_counter() - clock.start) / (steps - skip)
    return run


def timed_tape(run):
    def timed(steps):
        t0 = time.perf_counter()
        run(steps)
        return (time.perf_counter() - t0) / steps
    return timed


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loop", choices=("tape", "fit"), default="tape")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--skip", type=int, default=5, help="fit: steps of each call not timed")
    p.add_argument("--repeats", type=int, default=31)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", default="results/bench_packing")
    args = p.parse_args()
    if args.loop == "fit" and args.steps <= args.skip:
        p.error(f"--steps ({args.steps}) must be larger than --skip ({args.skip})")
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)  # >= 2: see docs/performance.md
    keras = _keras()
    hvd.init()
    rng = np.random.RandomState(hvd.rank())
    x = rng.uniform(size=(args.batch_size, 28, 28, 1)).astype(np.float32)
    y = rng.randint(0, 10, size=(args.batch_size,)).astype(np.int64)
    ds = tf.data.Dataset.from_tensors((x, y)).repeat().prefetch(4)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    runs = {}
    limit = packing.PACK_BYTES
    for kind in KINDS:
        packing.PACK_BYTES = 0 if kind == "unpacked" else limit  # read when the step is traced
        model = build_model(keras, "mlp", (28, 28, 1), 10)
        opt = keras.optimizers.SGD(0.01, momentum=0.9)
        if args.loop == "tape":
            runs[kind] = timed_tape(tape_loop(tf, hvd_tf, model, opt, loss, kind != "plain",
                                              x, y))
        else:
            opt = opt if kind == "plain" else hvd.DistributedOptimizer(opt)
            runs[kind] = fit_loop(keras, model, opt, loss, ds, args.skip)
        runs[kind](max(args.warmup, args.skip + 1))  # trace and warm up
    packing.PACK_BYTES = limit
    times = {kind: [] for kind in KINDS}
    for _ in range(args.repeats):
        for kind, run in runs.items():
            core.barrier()
            times[kind].append(float(core.allreduce(np.array(run(args.steps)), op=core.Max)))
    if hvd.rank() != 0:
        return
    ratios = np.array(times["packed"]) / np.array(times["unpacked"])
    q1, median, q3 = (float(v) for v in np.percentile(ratios, [25, 50, 75]))
    print(f"48-layer MLP, loop {args.loop}, np={hvd.size()}, batch {args.batch_size}/rank, "
          f"{args.repeats} repeats of {args.steps} steps")
    print(f"{'step':>9} {'median ms':>10} {'best ms':>8}")
    for kind, ts in times.items():
        print(f"{kind:>9} {1e3 * np.median(ts):>10.2f} {1e3 * min(ts):>8.2f}")
    print(f"packed / unpacked, per repeat: median {median:.3f}, quartiles {q1:.3f}-{q3:.3f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"loop": args.loop, "np": hvd.size(), "batch_size_per_rank": args.batch_size,
              "steps": args.steps, "repeats": args.repeats,
              "skip": args.skip if args.loop == "fit" else 0, "step_times_s": times,
              "packed_over_unpacked": {"median": median, "q1": q1, "q3": q3}}
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    with figure(out.with_suffix(".png"), figsize=(6, 4), dpi=100) as (fig, ax):
        ax.boxplot([[1e3 * t for t in times[k]] for k in KINDS])
        ax.set_xticks(range(1, len(KINDS) + 1), KINDS)
        ax.set_ylabel("ms a step (slowest rank)")
        ax.set_title(f"48-layer MLP, {args.loop} loop, np={hvd.size()}: packed / unpacked "
                     f"{median:.2f}", fontsize=9)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
