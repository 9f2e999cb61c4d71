#!/usr/bin/env python
"""Synchronous data parallelism against asynchronous parameter servers, on the same job.

    python scripts/compare_async.py [--quick] [--out results/compare_async]

Run it WITHOUT mpirun: it starts one job per run (through ``hvdlikerun``). Every run trains
the example's CNN (examples/keras_mnist.py) on the same synthetic MNIST-shaped images, from the
same initial weights, with Adam (lr 0.001), until it has applied the same number of
examples, in these modes:

  ``sync``       ``hvd.DistributedOptimizer``, one rank per worker (global batch W x b)
  ``async``      ``hvd.ParameterServerTraining`` (no staleness bound), S servers + W workers
  ``native_ps``  tf_keras's ``ParameterServerStrategy`` with a ``ClusterCoordinator``,
                 started by ``export_tf_config(num_ps=S)``: a chief (rank 0, which only
                 coordinates), S ps and W workers; its steps go to whichever worker is free

each (a) with equal workers and (b) with one worker slowed 3x (its input pipeline sleeps
three times the measured time of a step, which the step's own work overlaps), for
S + W = 1 + 2 and 2 + 2. Reported per run:
examples/s of the whole job (examples applied / wall time of training), the final loss and
accuracy on 2,000 held-out images, the mean staleness of applied steps (steps the other
workers applied between a worker's read of the weights and its own update; native_ps counts
them in a variable on a ps task) and, for async, the mean relative L2 distance between the
weights a push was computed on and the weights it was applied to. Writes ``OUT.json`` (a
list of runs: ``mode``, ``slowed``, ``servers``, ``workers``, ``seed``, ``examples_per_s``,
``final_accuracy``, ...) and ``OUT.png``, prints a table. ``--repeats N`` runs it all N
times from the initial weights of seeds 0..N-1 and adds the mean and range over them. A
native_ps run that fails in TensorFlow's own RPCs runs once more (its run then has
``retried_after``, the first attempt's output).
``--quick`` (8,192 examples per run) takes about 2.5 minutes on 2 cores; ``--only-slowed``
skips the async and native_ps runs with equal workers, ``--only-equal`` those with a worker
slowed.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench_output import figure

REPO = Path(__file__).resolve().parent.parent
MODES = ("sync", "async", "native_ps")
# how TensorFlow reports an RPC of its own that failed between two of its tasks
NATIVE_GRPC_ERROR = "Additional GRPC error information"


def run_job(args, mode, servers, workers, slow_ms, seed):
    # native_ps also needs its chief (rank 0), which only coordinates
    np_ = workers + {"sync": 0, "async": servers, "native_ps": servers + 1}[mode]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO),
               TF_USE_LEGACY_KERAS="1" if mode == "native_ps" else "0")
    cmd = [sys.executable, "-m", "hvdlike.runner", "-np", str(np_), sys.executable, __file__,
           "--role", mode, "--servers", str(servers), "--examples", str(args.examples),
           "--batch", str(args.batch), "--slow-ms", str(slow_ms),
           "--optimizer", args.optimizer, "--lr", str(args.lr), "--seed", str(seed)]
    cmd += ["--no-lookahead"] if args.no_lookahead else []
    start = time.time()
    p = subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=600)
    retried = None
    if mode == "native_ps" and p.returncode != 0 and NATIVE_GRPC_ERROR in p.stdout + p.stderr:
        # TensorFlow's own RPCs between its chief and a worker failed (once in ~20 CI runs:
        # "Unable to parse request"): not a result of the comparison; run it once more
        retried = (p.stdout + p.stderr)[-1500:]
        print(f"compare_async: native_ps ({servers}+{workers}, seed {seed}) failed inside "
              f"TensorFlow's gRPC; running it once more:\n{retried}", file=sys.stderr)
        start = time.time()
        p = subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=600)
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        return {"mode": mode, "servers": servers, "workers": workers, "slowed": slow_ms > 0,
                "seed": seed, "error": (p.stdout + p.stderr)[-1500:], "examples_per_s": None,
                "final_accuracy": None}
    result = json.loads(lines[-1][len("RESULT "):])
    result.update(mode=mode, servers=servers, workers=workers, slowed=slow_ms > 0,
                  slow_ms=slow_ms, seed=seed, job_seconds=time.time() - start)
    if retried:
        result["retried_after"] = retried
    return result


def driver(args):
    examples = args.examples
    configs = [tuple(int(n) for n in c.split("+")) for c in args.configs.split(",")]
    runs = []
    # a first job pays for cold caches (the first training run here took up to 2x as long),
    # which would skew the slowed worker's delay: run one and drop it
    warm = {} if args.no_warmup else run_job(args, "sync", 1, configs[0][1], 0, args.seed)
    for seed in range(args.seed, args.seed + args.repeats):
        for servers, workers in configs:
            base = run_job(args, "sync", servers, workers, 0, seed)
            runs.append(base)
            # this machine has slow phases: the faster of two sync jobs sets the step
            seconds = min((r["train_seconds"] for r in (warm, base)
                           if r.get("workers") == workers and r.get("train_seconds")),
                          default=1.0)
            step_ms = 1000 * seconds / max(1, examples // (workers * args.batch))
            # the wait overlaps the step's own work (tf.data runs ahead of the step), so a
            # step of the slowed worker takes about as long as its wait: 3x
            slow_ms = 3 * step_ms
            for mode in MODES:
                for slow in ((slow_ms,) if args.only_slowed else
                             (0,) if args.only_equal else (0, slow_ms)):
                    if mode == "sync" and slow == 0:
                        continue
                    runs.append(run_job(args, mode, servers, workers, slow, seed))
                    r = runs[-1]
                    print(f"  seed {seed} {mode:9s} {servers}+{workers} slowed={bool(slow)!s:5s} "
                          f"ex/s={r.get('examples_per_s')} acc={r.get('final_accuracy')}"
                          + (f" ERROR {r['error'][-300:]}" if r.get("error") else ""),
                          flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(runs, indent=1))
    print_table(runs)
    if args.repeats > 1:
        print_summary(runs)
    plot(runs, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


def print_table(runs):
    print(f"\n{'servers+workers':16s} {'seed':>4s} {'mode':10s} {'slowed':7s} {'examples/s':>10s} "
          f"{'vs sync':>8s} {'loss':>7s} {'accuracy':>9s} {'drift':>7s} {'staleness':>9s}")
    for r in runs:
        sync = next((s for s in runs if s["mode"] == "sync" and s["slowed"] == r["slowed"]
                     and s["servers"] == r["servers"] and s["workers"] == r["workers"]
                     and s.get("seed") == r.get("seed")), None)
        eps = r.get("examples_per_s")
        ratio = (f"{eps / sync['examples_per_s']:.2f}" if eps and sync
                 and sync.get("examples_per_s") else "-")
        name = f"{r['servers']}+{r['workers']}"
        seed = r.get("seed", 0)
        if r.get("error"):
            print(f"{name:16s} {seed:4d} {r['mode']:10s} {str(r['slowed']):7s} failed: "
                  f"{r['error'].splitlines()[-1][:80]}")
            continue
        print(f"{name:16s} {seed:4d} {r['mode']:10s} {str(r['slowed']):7s} {eps:10.0f} {ratio:>8s} "
              f"{r['final_loss']:7.4f} {r['final_accuracy']:9.4f} {_num(r.get('drift')):>7s} "
              f"{_num(r.get('mean_staleness'), 2):>9s}")


def summary(runs):
    """Per servers+workers, mode and slowed: the mean and range over seeds of the accuracy,
    and the mean examples/s over sync's of the same seed."""
    groups = {}
    for r in runs:
        if not r.get("error"):
            groups.setdefault((r["servers"], r["workers"], r["mode"], r["slowed"]), []).append(r)
    rows = []
    for (servers, workers, mode, slowed), group in groups.items():
        acc = [r["final_accuracy"] for r in group]
        ratios = []
        for r in group:
            sync = groups.get((servers, workers, "sync", slowed), [])
            base = [s["examples_per_s"] for s in sync if s.get("seed") == r.get("seed")]
            if base:
                ratios.append(r["examples_per_s"] / base[0])
        rows.append({"servers": servers, "workers": workers, "mode": mode, "slowed": slowed,
                     "seeds": len(group), "mean_accuracy": sum(acc) / len(acc),
                     "min_accuracy": min(acc), "max_accuracy": max(acc),
                     "mean_vs_sync": sum(ratios) / len(ratios) if ratios else None})
    return rows


def print_summary(runs):
    print(f"\n{'servers+workers':16s} {'mode':10s} {'slowed':7s} {'seeds':>5s} "
          f"{'accuracy (mean, min-max)':>26s} {'examples/s vs sync':>19s}")
    for row in summary(runs):
        print(f"{row['servers']}+{row['workers']:<14d} {row['mode']:10s} {str(row['slowed']):7s} "
              f"{row['seeds']:5d} {row['mean_accuracy']:10.4f} ({row['min_accuracy']:.4f}-"
              f"{row['max_accuracy']:.4f}) {_num(row['mean_vs_sync'], 2):>19s}")


def _num(value, digits=4):
    return "-" if value is None else f"{value:.{digits}f}"


def plot(runs, path):
    rows = summary(runs)
    labels = [f"{r['mode']}\n{r['servers']}+{r['workers']}{' slow' if r['slowed'] else ''}"
              for r in rows]
    colors = {"sync": "tab:blue", "async": "tab:orange", "native_ps": "tab:green"}
    with figure(path, 1, 2, figsize=(13, 4.5)) as (fig, axes):
        ratios = [r["mean_vs_sync"] or 0.0 for r in rows]
        axes[0].bar(range(len(rows)), ratios, color=[colors[r["mode"]] for r in rows])
        axes[0].set_title("examples/s of the whole job, over sync's")
        mean = [r["mean_accuracy"] for r in rows]
        spread = [[m - r["min_accuracy"] for m, r in zip(mean, rows)],
                  [r["max_accuracy"] - m for m, r in zip(mean, rows)]]
        axes[1].bar(range(len(rows)), mean, yerr=spread, capsize=3,
                    color=[colors[r["mode"]] for r in rows])
        axes[1].set_title("held-out accuracy (mean and range over seeds)")
        for ax in axes:
            ax.set_xticks(range(len(rows)))
            ax.set_xticklabels(labels, fontsize=7)


# ---------------------------------------------------------------------- one job (a rank)

def role(args):
    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import hvdlike.tensorflow as hvd
    from hvdlike.tensorflow import compat
    sys.path.insert(0, str(REPO / "examples"))
    from keras_mnist import synthetic_mnist
    keras = compat.keras()
    hvd.init()
    if args.role == "native_ps":
        return native_role(args, hvd, keras, np, tf, synthetic_mnist)
    x, y = synthetic_mnist(args.examples, 1)
    xt, yt = synthetic_mnist(2000, 2)
    keras.utils.set_random_seed(args.seed)
    model = make_model(keras)
    opt = make_optimizer(keras, args)
    sleep = args.slow_ms / 1000.0

    def dataset(worker, workers, repeat):
        ds = tf.data.Dataset.from_tensor_slices((x[worker::workers], y[worker::workers]))
        if repeat:
            ds = ds.repeat()
        ds = ds.batch(args.batch, drop_remainder=True)
        if sleep and worker == workers - 1:  # the slowed worker's input pipeline
            ds = ds.apply(slow_down(sleep))
        return ds.prefetch(2)

    stats, drift = {}, 0.0
    hvd.barrier()
    start = time.perf_counter()
    if args.role == "sync":
        model.compile(optimizer=hvd.DistributedOptimizer(opt),
                      loss="sparse_categorical_crossentropy")
        model.fit(dataset(hvd.rank(), hvd.size(), False), epochs=1, verbose=0)
        applied = args.examples // (hvd.size() * args.batch) * hvd.size() * args.batch
    else:
        ps = hvd.ParameterServerTraining(model, opt, num_servers=args.servers,
                                         total_steps=args.examples // args.batch,
                                         lookahead=not args.no_lookahead)
        model.compile(optimizer=ps.optimizer, loss="sparse_categorical_crossentropy")
        ps.run(lambda: model.fit(dataset(ps.worker_index, ps.num_workers, True),
                                 steps_per_epoch=args.examples, epochs=1, verbose=0,
                                 callbacks=[ps.callback()]))
        stats = ps.stats
        applied = stats["updates"] * args.batch
        drift = stats["mean_drift"]
    seconds = time.perf_counter() - start
    if hvd.rank() == 0:
        model.compile(optimizer=keras.optimizers.SGD(0.0),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        loss, acc = model.evaluate(xt, yt, batch_size=500, verbose=0)
        print("RESULT " + json.dumps({
            "examples_per_s": applied / seconds, "examples": applied,
            "train_seconds": seconds, "final_loss": float(loss), "final_accuracy": float(acc),
            "drift": drift, "mean_staleness": stats.get("mean_staleness", 0.0),
            "pushes": {str(k): v for k, v in stats.get("pushes", {}).items()},
            "staleness_by_worker": {str(k): v for k, v in
                                    stats.get("mean_staleness_by_worker", {}).items()}}),
              flush=True)


def slow_down(seconds):
    """A tf.data transformation that waits ``seconds`` before each element, in TensorFlow's
    own threads (a Python sleep inside tf.numpy_function can deadlock the exit of the
    process when TensorFlow's prefetch thread still wants the GIL)."""
    from tensorflow.python.data.experimental.ops import testing
    return testing.sleep(int(seconds * 1e6))


def make_optimizer(keras, args):
    if args.optimizer == "sgd":
        return keras.optimizers.SGD(args.lr, momentum=0.9)
    return keras.optimizers.Adam(args.lr)


def make_model(keras):
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10, activation="softmax")])


def native_role(args, hvd, keras, np, tf, synthetic_mnist):
    """tf_keras ParameterServerStrategy: rank 0 the chief, ranks 1..S ps, the rest workers.
    ps and worker ranks serve inside export_tf_config until the chief is done."""
    hvd.export_tf_config(num_ps=args.servers)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    x, y = synthetic_mnist(args.examples, 1)
    xt, yt = synthetic_mnist(2000, 2)
    workers = len(resolver.cluster_spec().as_dict().get("worker", []))
    sleep = args.slow_ms / 1000.0
    with strategy.scope():
        keras.utils.set_random_seed(args.seed)
        model = make_model(keras)
        opt = make_optimizer(keras, args)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(
            reduction=keras.losses.Reduction.NONE)
        applied = tf.Variable(0, dtype=tf.int64)  # steps applied, on a ps task

    def dataset_fn(context):
        worker = context.input_pipeline_id if context else 0
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(
            context.num_input_pipelines if context else 1, worker).repeat()
        ds = ds.batch(args.batch, drop_remainder=True)
        if sleep and worker == workers - 1:
            ds = ds.apply(slow_down(sleep))
        return ds

    @tf.function
    def step(iterator):
        def replica(a, b):
            # staleness as async's: the steps other workers applied while this one ran
            start = applied.read_value()
            with tf.control_dependencies([start]):
                a = tf.identity(a)
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(b, model(a, training=True)))
            grads = tape.gradient(loss, model.trainable_variables)
            # one step of the optimizer per worker step, as Keras fit takes it
            update = opt.apply_gradients(zip(grads, model.trainable_variables))
            with tf.control_dependencies([update]):
                return applied.assign_add(1) - start - 1
        return strategy.run(replica, args=next(iterator))

    per_worker = coordinator.create_per_worker_dataset(
        strategy.distribute_datasets_from_function(dataset_fn))
    iterator = iter(per_worker)
    steps = args.examples // args.batch
    start = time.perf_counter()
    staleness = [coordinator.schedule(step, args=(iterator,)) for _ in range(steps)]
    coordinator.join()
    seconds = time.perf_counter() - start
    staleness = [int(s.fetch()) for s in staleness]
    keras.utils.set_random_seed(0)
    plain = make_model(keras)  # evaluated outside the strategy, as the other modes are
    plain.set_weights(model.get_weights())
    plain.compile(optimizer=keras.optimizers.SGD(0.0), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    loss, acc = plain.evaluate(xt, yt, batch_size=500, verbose=0)
    print("RESULT " + json.dumps({
        "examples_per_s": steps * args.batch / seconds, "examples": steps * args.batch,
        "train_seconds": seconds, "final_loss": float(loss), "final_accuracy": float(acc),
        "drift": None, "mean_staleness": float(np.mean(staleness))}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="8,192 examples per run")
    p.add_argument("--examples", type=int, default=36864,
                   help="examples applied per run (default: the seeds example's 3 epochs of 12,288)")
    p.add_argument("--batch", type=int, default=32, help="per-worker batch")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--configs", default="1+2,2+2", help="servers+workers, comma-separated")
    p.add_argument("--out", default=str(REPO / "results" / "compare_async" / "compare_async"))
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the first, dropped job that warms the caches (quicker; the "
                        "slowed worker's delay may then come out longer)")
    p.add_argument("--only-slowed", action="store_true",
                   help="run each mode only with one worker slowed (the equal sync run still "
                        "runs first: it sets the delay)")
    p.add_argument("--only-equal", action="store_true",
                   help="run each mode only with equal workers")
    p.add_argument("--repeats", type=int, default=1,
                   help="run everything this many times, with initial weights from seeds "
                        "SEED, SEED+1, ...; prints the mean and range over them")
    p.add_argument("--seed", type=int, default=0, help="the first seed of the initial weights")
    p.add_argument("--no-lookahead", action="store_true",
                   help="async without lookahead (ParameterServerTraining(lookahead=False))")
    p.add_argument("--role", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--servers", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--slow-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.examples = 8192
    if args.role:
        role(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
