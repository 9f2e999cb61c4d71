#!/usr/bin/env python
"""hvdlike against native tf.distribute on the same job: training and all-reduce.

    python scripts/compare_tf_distribute.py [--np 2] [--steps 30] [--out results/compare_tf_distribute]

Run it WITHOUT mpirun: it starts one job per configuration itself (through ``hvdlikerun``).

Training (same CNN, same MNIST-shaped synthetic data, same initial weights, same global
batch = per-replica batch x np, plain SGD):

  (a) ``hvd``      hvdlike.keras.DistributedOptimizer + Keras 3 model.fit, np ranks
  (b) ``strategy`` hvdlike.tensorflow.MPIStrategy + Keras 3 model.fit, np ranks
  (c) ``native``   tf.distribute.MultiWorkerMirroredStrategy started with
                   hvdlike.tensorflow.export_tf_config(), np ranks.  Keras 3 model.fit fails
                   with it (TF 2.21 / Keras 3.15; the script tries and reports the error),
                   so this row uses tf_keras (TF_USE_LEGACY_KERAS=1).
  (d) ``single``   one process, Keras 3, the whole global batch

Reported: img/s (global images per second over the timed steps), time for the timed steps,
final loss (the trained model's mean loss on a fixed set of 512 training images, computed
the same way in every mode; Keras's own running loss is in the JSON), the largest weight
difference between ranks, and the largest difference from (d)'s weights.

All-reduce (one np-rank job, float32, sizes as scripts/bench_allreduce.py): native TF
collective all-reduce (MultiWorkerMirroredStrategy's ``all_reduce`` in a replica context,
gRPC ring), MPIStrategy's ``all_reduce`` in a replica context (tf.function ->
tf.numpy_function -> hvdlike), hvdlike's NumPy ``allreduce`` and raw mpi4py
``comm.Allreduce``; median of several timed batches, slowest rank.

Writes ``OUT.json`` (everything) and ``OUT.png`` (bar charts), prints tables.  Each rank
uses one intra-op and one inter-op TensorFlow thread.  At np=2 on a 2-core machine the
whole run takes about 2-3 minutes.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from bench_output import figure

REPO = Path(__file__).resolve().parent.parent
SIZES = "1KiB,4KiB,16KiB,64KiB,256KiB,1MiB,4MiB,16MiB,64MiB"
MODES = ("hvd", "strategy", "native", "single")
LABELS = {"hvd": "(a) hvd.DistributedOptimizer", "strategy": "(b) hvdlike MPIStrategy",
          "native": "(c) native MWMS (tf_keras)", "single": "(d) one process"}


def parse_size(text):
    units = {"kib": 1 << 10, "mib": 1 << 20, "b": 1, "": 1}
    t = text.strip().lower()
    num = "".join(c for c in t if c.isdigit())
    return int(num) * units[t[len(num):]]


def human(nbytes):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= k:
            return f"{nbytes // k}{unit}"
    return f"{nbytes}B"


# =========================================================================== workers

def _setup_tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    return tf


def _data(args, size):
    import numpy as np
    glob = args.per_replica_batch * size
    total = (args.warmup + args.steps) * glob
    protos = np.random.RandomState(0).uniform(0, 1, size=(10, 28, 28, 1)).astype(np.float32)
    rng = np.random.RandomState(1)
    y = rng.randint(0, 10, size=total).astype(np.int64)
    x = np.clip(protos[y] + rng.normal(0, 0.6, size=(total, 28, 28, 1)), 0, 1).astype(np.float32)
    return x, y, glob


def _build(keras, initial):
    model = keras.Sequential([
        keras.Input((28, 28, 1)), keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(), keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    if initial is None:
        return model
    model.set_weights(initial)
    return model


def _initial_weights(keras):
    import numpy as np
    rs = np.random.RandomState(42)
    return [rs.normal(0, 0.05, w.shape).astype(np.float32)
            for w in _build(keras, None).get_weights()]


def _timed_fit(model, dataset, args, keras):
    """fit() warmup + steps in one epoch; time the last ``steps`` batches."""
    marks, losses = {}, []

    class Timer(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == args.warmup - 1:
                marks["t0"] = time.perf_counter()
                marks["loss0"] = float(logs["loss"]) * args.warmup
            if batch == args.warmup + args.steps - 1:
                marks["t1"] = time.perf_counter()
                losses.append(float(logs["loss"]))

    model.fit(dataset, epochs=1, steps_per_epoch=args.warmup + args.steps, verbose=0,
              callbacks=[Timer()])
    # Keras reports the running mean over the epoch; recover the mean of the timed steps.
    total = losses[0] * (args.warmup + args.steps)
    return marks["t1"] - marks["t0"], (total - marks["loss0"]) / args.steps


def _weight_report(weights, hvd_mod):
    import numpy as np
    flat = np.concatenate([w.ravel() for w in weights])
    if hvd_mod is None:
        return flat, 0.0
    everyone = hvd_mod.allgather_object(flat)
    return flat, max(float(np.max(np.abs(e - flat))) for e in everyone)


def worker_train(args):
    mode = args.worker
    native_keras3_error = None
    if mode == "native":
        from hvdlike.tensorflow import export_tf_config
        export_tf_config()                           # before TensorFlow starts
    tf = _setup_tf()
    if mode == "native":  # before any other TF op: it configures TF's collective runtime
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    import numpy as np
    from hvdlike.tensorflow import compat
    keras = compat.keras()
    hvd = None
    rank, size = 0, 1
    if mode != "single":
        import hvdlike.tensorflow as hvd
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    x, y, glob = _data(args, args.np)  # the same global batch in every mode (single too)
    initial = _initial_weights(keras)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    if mode == "native":
        import keras as keras3                       # try Keras 3 fit first, report failure
        with strategy.scope():
            m3 = _build(keras3, None)
            m3.compile(optimizer=keras3.optimizers.SGD(args.lr),
                       loss=keras3.losses.SparseCategoricalCrossentropy(from_logits=True))
        try:
            m3.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(glob), epochs=1,
                   steps_per_epoch=1, verbose=0)
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            native_keras3_error = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
        with strategy.scope():
            model = _build(keras, initial)
            model.compile(optimizer=keras.optimizers.SGD(args.lr), loss=loss)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(glob).repeat()
    elif mode == "strategy":
        strategy = hvd.MPIStrategy()
        with strategy.scope():
            model = _build(keras, initial)
            model.compile(optimizer=keras.optimizers.SGD(args.lr), loss=loss)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(glob).repeat()
    elif mode == "hvd":
        import hvdlike.keras as hvdk
        b = args.per_replica_batch
        idx = np.concatenate([np.arange(s * glob + rank * b, s * glob + (rank + 1) * b)
                              for s in range(args.warmup + args.steps)])
        model = _build(keras, initial)
        model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(args.lr)),
                      loss=loss)
        ds = tf.data.Dataset.from_tensor_slices((x[idx], y[idx])).batch(b).repeat()
    else:  # single
        model = _build(keras, initial)
        model.compile(optimizer=keras.optimizers.SGD(args.lr), loss=loss)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(glob).repeat()

    seconds, keras_loss = _timed_fit(model, ds, args, keras)
    # Final loss measured the same way in every mode: the trained model on a fixed set.
    ex, ey = x[:512], y[:512]
    logits = model(ex, training=False)
    final_loss = float(tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(ey, logits)))
    if hvd is not None:
        seconds = max(hvd.allgather_object(seconds))
    flat, rank_diff = _weight_report(model.get_weights(), hvd)
    if rank == 0:
        np.save(args.result + ".npy", flat)
        out = dict(mode=mode, ranks=size, keras="tf_keras" if compat.use_legacy_keras()
                   else "keras3", global_batch=glob, steps=args.steps,
                   seconds=seconds, img_per_s=args.steps * glob / seconds,
                   final_loss=final_loss, keras_reported_loss_timed_steps=keras_loss,
                   max_weight_diff_between_ranks=rank_diff,
                   native_keras3_fit_error=native_keras3_error)
        Path(args.result).write_text(json.dumps(out))


def worker_allreduce(args):
    from hvdlike.tensorflow import export_tf_config
    export_tf_config()                               # native strategy needs TF_CONFIG first
    tf = _setup_tf()
    import numpy as np
    from mpi4py import MPI
    import hvdlike as core
    import hvdlike.tensorflow as hvd
    hvd.init()
    comm = MPI.COMM_WORLD
    native = tf.distribute.MultiWorkerMirroredStrategy()
    ours = hvd.MPIStrategy()
    sizes = [parse_size(s) for s in args.sizes.split(",")]

    def replica_all_reduce(strategy, x):
        @tf.function
        def fn():
            return tf.distribute.get_replica_context().all_reduce("SUM", x)
        # strategy.run returns once the step has run (CPU, eager): no .numpy() copy timed.
        return lambda: strategy.experimental_local_results(strategy.run(fn))[0]

    def median_time(call, iters):
        call()  # warm (traces the tf.function)
        call()
        times = []
        for _ in range(args.batches):
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            times.append(comm.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX))
        return float(np.median(times))

    rows = []
    for nbytes in sizes:
        a = np.ones(nbytes // 4, np.float32)
        recv = np.empty_like(a)
        t = tf.constant(a)
        iters = int(min(50, max(2, (8 << 20) // nbytes)))
        native_iters = int(min(20, max(1, (1 << 20) // nbytes)))
        row = dict(bytes=nbytes, size=human(nbytes))
        with native.scope():
            row["native_s"] = median_time(replica_all_reduce(native, t), native_iters)
        with ours.scope():
            row["strategy_s"] = median_time(replica_all_reduce(ours, t), iters)
        row["hvdlike_s"] = median_time(lambda: core.allreduce(a, op=core.Sum), iters)
        row["mpi4py_s"] = median_time(lambda: comm.Allreduce(a, recv, op=MPI.SUM), iters)
        for k in ("native", "strategy", "hvdlike", "mpi4py"):
            row[k + "_GBps"] = nbytes / row[k + "_s"] / 1e9
        row["strategy_over_native"] = row["native_s"] / row["strategy_s"]
        rows.append(row)
        if comm.rank == 0:
            print(f"  all-reduce {row['size']:>7}: native {row['native_s']*1e3:9.3f} ms  "
                  f"MPIStrategy {row['strategy_s']*1e3:9.3f} ms  ({row['strategy_over_native']:.1f}x)",
                  flush=True)
    if comm.rank == 0:
        Path(args.result).write_text(json.dumps(dict(ranks=comm.size, rows=rows)))


# =========================================================================== driver

def launch(args, worker, nranks, env_extra, result, timeout):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
               PYTHONUNBUFFERED="1", **env_extra)
    if args.no_onednn:
        env["TF_ENABLE_ONEDNN_OPTS"] = "0"
    base = [sys.executable, str(Path(__file__).resolve()), "--worker", worker, "--result", result,
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--lr", str(args.lr),
            "--per-replica-batch", str(args.per_replica_batch), "--sizes", args.sizes,
            "--batches", str(args.batches), "--np", str(args.np)]
    cmd = base if nranks is None else [sys.executable, "-m", "hvdlike.runner", "-np",
                                       str(nranks), *base]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if proc.returncode != 0 or not Path(result).exists():
        tail = "\n".join(proc.stdout.splitlines()[-30:])
        raise SystemExit(f"{worker} job failed (exit {proc.returncode}):\n{tail}")
    for line in proc.stdout.splitlines():
        if line.startswith("  all-reduce"):
            print(line)
    return json.loads(Path(result).read_text()), time.perf_counter() - t0


def plot(report, path):
    with figure(path, 1, 2, figsize=(13, 4.8), dpi=110) as (fig, (ax1, ax2)):
        train = report["training"]
        names = [LABELS[r["mode"]] for r in train]
        ax1.bar(range(len(train)), [r["img_per_s"] for r in train],
                color=["#4c72b0", "#55a868", "#c44e52", "#8c8c8c"][:len(train)])
        ax1.set_xticks(range(len(train)), [n.replace(" ", "\n", 1) for n in names], fontsize=8)
        ax1.set_ylabel("images / s (global)")
        ax1.set_title(f"training, np={report['np']}, global batch {train[0]['global_batch']}")
        for i, r in enumerate(train):
            ax1.text(i, r["img_per_s"], f"{r['img_per_s']:.0f}", ha="center", va="bottom")
        rows = report["allreduce"]["rows"]
        xs = range(len(rows))
        w = 0.2
        for k, (key, label) in enumerate([("native", "native MWMS all_reduce"),
                                          ("strategy", "MPIStrategy all_reduce"),
                                          ("hvdlike", "hvdlike.allreduce (NumPy)"),
                                          ("mpi4py", "mpi4py Allreduce")]):
            ax2.bar([x + (k - 1.5) * w for x in xs], [r[key + "_GBps"] for r in rows], w,
                    label=label)
        ax2.set_yscale("log")
        ax2.set_xticks(list(xs), [r["size"] for r in rows], fontsize=8)
        ax2.set_ylabel("algbw GB/s (log)")
        ax2.set_title(f"all-reduce float32, np={report['np']}")
        ax2.legend(fontsize=8)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--steps", type=int, default=30, help="timed training steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (tracing)")
    p.add_argument("--per-replica-batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--sizes", default=SIZES)
    p.add_argument("--batches", type=int, default=5, help="timed batches per all-reduce size")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--no-allreduce", action="store_true")
    p.add_argument("--no-onednn", action="store_true",
                   help="TF_ENABLE_ONEDNN_OPTS=0 in every job (TensorFlow's default is on)")
    p.add_argument("--out", default=str(REPO / "results" / "compare_tf_distribute"))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker == "allreduce":
        return worker_allreduce(args)
    if args.worker:
        return worker_train(args)

    started = time.perf_counter()
    report = dict(np=args.np, steps=args.steps, per_replica_batch=args.per_replica_batch,
                  training=[], date=time.strftime("%Y-%m-%d %H:%M:%S"))
    with tempfile.TemporaryDirectory(prefix="hvdlike-compare-") as tmp:
        for mode in args.modes.split(","):
            env = {"TF_USE_LEGACY_KERAS": "1"} if mode == "native" else {}
            nranks = None if mode == "single" else args.np
            print(f"training: {LABELS[mode]} ...", flush=True)
            res, wall = launch(args, mode, nranks, env, f"{tmp}/{mode}.json", timeout=600)
            res["job_wall_s"] = wall
            res["weights"] = f"{tmp}/{mode}.json.npy"
            report["training"].append(res)
        import numpy as np
        single = next((r for r in report["training"] if r["mode"] == "single"), None)
        ref = np.load(single["weights"]) if single else None
        for r in report["training"]:
            w = np.load(r.pop("weights"))
            r["max_weight_diff_vs_single"] = None if ref is None else float(np.max(np.abs(w - ref)))
        if not args.no_allreduce:
            print("all-reduce comparison ...", flush=True)
            report["allreduce"], _ = launch(args, "allreduce", args.np, {},
                                            f"{tmp}/allreduce.json", timeout=600)
    report["total_wall_s"] = time.perf_counter() - started

    print(f"\nTraining: np={args.np}, per-replica batch {args.per_replica_batch}, "
          f"{args.steps} timed steps (after {args.warmup} warm-up steps), SGD lr {args.lr}")
    hdr = f"{'configuration':32} {'keras':8} {'img/s':>8} {'time s':>8} {'final loss':>11} " \
          f"{'max Δw ranks':>13} {'max Δw vs (d)':>14}"
    print(hdr)
    print("-" * len(hdr))
    for r in report["training"]:
        vs = "-" if r["max_weight_diff_vs_single"] is None else f"{r['max_weight_diff_vs_single']:.2e}"
        print(f"{LABELS[r['mode']]:32} {r['keras']:8} {r['img_per_s']:8.0f} {r['seconds']:8.2f} "
              f"{r['final_loss']:11.5f} {r['max_weight_diff_between_ranks']:13.2e} {vs:>14}")
    for r in report["training"]:
        if r.get("native_keras3_fit_error"):
            print(f"note: native MultiWorkerMirroredStrategy + Keras 3 model.fit failed "
                  f"({r['native_keras3_fit_error']}); row (c) uses tf_keras "
                  "(TF_USE_LEGACY_KERAS=1).")
        elif r["mode"] == "native":
            print("note: native MultiWorkerMirroredStrategy + Keras 3 model.fit did NOT fail "
                  "this time; row (c) still uses tf_keras.")
    if "allreduce" in report:
        print(f"\nAll-reduce, float32, np={args.np} (median of {args.batches} batches, slowest rank)")
        hdr = f"{'size':>7} {'native MWMS':>12} {'MPIStrategy':>12} {'hvdlike':>10} " \
              f"{'mpi4py':>10}   (GB/s)  {'MPIStrategy/native':>18}"
        print(hdr)
        for row in report["allreduce"]["rows"]:
            print(f"{row['size']:>7} {row['native_GBps']:12.4f} {row['strategy_GBps']:12.4f} "
                  f"{row['hvdlike_GBps']:10.4f} {row['mpi4py_GBps']:10.4f}   "
                  f"{'':6}  {row['strategy_over_native']:17.1f}x")
        big = report["allreduce"]["rows"][-1]
        report["target_10x_at_largest"] = big["strategy_over_native"] >= 10.0
        print(f"target: MPIStrategy all-reduce >= 10x native at {big['size']}: "
              f"{big['strategy_over_native']:.1f}x -> "
              f"{'met' if report['target_10x_at_largest'] else 'NOT met'}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    if "allreduce" in report:
        plot(report, out.with_suffix(".png"))
    print(f"\nwrote {out.with_suffix('.json')}" + (f" and {out.with_suffix('.png')}"
                                                    if "allreduce" in report else "")
          + f"  (total {report['total_wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
