"""Training-step benchmark: DistributedOptimizer vs the plain optimizer, np=1 and np=2.

    python scripts/bench_train.py                    # runs np=1 and np=2 via mpirun
    python scripts/bench_train.py --nps 1,2,4 --out results/bench_train_np4
    python scripts/bench_train.py --model resnet50 --batch-size 2 --overlap both --timeline
    python scripts/bench_train.py --model mlp --loop tape

For each world size a model (``--model``: a small MNIST-shaped CNN; Keras' ResNet-50
with ``weights=None`` on 224x224 images; or a 48-layer MLP: many small gradients, short
steps, where a per-gradient cost shows) trains on synthetic data (per-rank batch
``--batch-size``, ``--threads`` TF threads per rank), once with the plain optimizer and once
distributed, alternating ``--repeats`` times in the same process; the best (minimum) step
time of the repeats is used, the median is also stored in the JSON. ``--loop fit``: Keras
``model.fit``, distributed with ``hvdlike.keras.DistributedOptimizer``; ``--loop tape``:
the loop of Horovod's TensorFlow 2 examples, a ``tf.function`` step with a
``DistributedGradientTape`` (plain: a ``tf.GradientTape``) and ``apply_gradients``.
``--overlap on|off|both`` sets HVDLIKE_OVERLAP for the runs with more than one rank
(``both``: one run each; HVDLIKE_OVERLAP_BUCKET and the other settings are passed on). ``--timeline`` also writes each run's timeline
(HVDLIKE_TIMELINE) into ``--out``; hvdlike-timeline reads it.
Reports: overhead ratio (distributed / plain step time, same run), the CPU time a step
takes per rank (all of a rank's threads: where ranks share cores, what a distributed step
adds shows here first), img/s per rank and in total, and scaling efficiency = total img/s
at np=N / (N * img/s at np=1).
Writes a table to stdout, ``bench_train.json`` and ``bench_train.png`` in ``--out``
(default ``results/bench_train``).
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

REPO = Path(__file__).resolve().parents[1]


def build_model(keras, model, shape, classes):
    """The benchmark's model in the given Keras (Keras 3 or tf_keras), seeded alike."""
    keras.utils.set_random_seed(0)
    if model == "resnet50":
        return keras.applications.ResNet50(weights=None, input_shape=shape, classes=classes)
    if model == "mlp":
        return keras.Sequential([keras.Input(shape), keras.layers.Flatten()]
                                + [keras.layers.Dense(64, activation="relu") for _ in range(47)]
                                + [keras.layers.Dense(classes)])
    return keras.Sequential([
        keras.Input(shape),
        keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(classes)])


def tape_loop(tf, hvd_tf, model, opt, loss, distributed, x, y):
    """Horovod's TensorFlow 2 examples' loop: returns ``run(steps)``, which runs a
    ``tf.function`` step (a DistributedGradientTape when ``distributed``) ``steps`` times."""
    x, y = tf.constant(x), tf.constant(y)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        if distributed:
            tape = hvd_tf.DistributedGradientTape(tape)
        grads = tape.gradient(value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return value

    def run(steps):
        for _ in range(steps):
            value = step()
        value.numpy()
    return run


def worker(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)  # >= 2: see docs/performance.md
    import hvdlike as core
    import hvdlike.keras as hvd
    import hvdlike.tensorflow as hvd_tf
    from hvdlike.base.settings import Settings
    from hvdlike.tensorflow.compat import keras as _keras
    keras = _keras()
    hvd.init()

    shape, classes = ((224, 224, 3), 1000) if args.model == "resnet50" else ((28, 28, 1), 10)

    def model_fn():
        return build_model(keras, args.model, shape, classes)

    rng = np.random.RandomState(hvd.rank())
    x = rng.uniform(size=(args.batch_size,) + shape).astype(np.float32)
    y = rng.randint(0, classes, size=(args.batch_size,)).astype(np.int64)
    ds = tf.data.Dataset.from_tensors((x, y)).repeat().prefetch(4)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=args.model != "resnet50")
    models, runs = {}, {}
    for kind in ("plain", "distributed"):
        m = model_fn()
        opt = keras.optimizers.SGD(0.01, momentum=0.9)
        if args.loop == "tape":
            runs[kind] = tape_loop(tf, hvd_tf, m, opt, loss, kind == "distributed", x, y)
        else:
            if kind == "distributed":
                opt = hvd.DistributedOptimizer(opt)
            m.compile(optimizer=opt, loss=loss)
            runs[kind] = lambda steps, m=m: m.fit(ds, steps_per_epoch=steps, epochs=1,
                                                  verbose=0)
        runs[kind](args.warmup)  # trace + warm up
        models[kind] = m
    times, cpu = {k: [] for k in models}, {k: [] for k in models}
    for _ in range(args.repeats):
        for kind, run in runs.items():
            hvd.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            run(args.steps)
            dt = (time.perf_counter() - t0) / args.steps
            dc = (time.process_time() - c0) / args.steps
            times[kind].append(float(hvd.allreduce(np.array(dt), op=hvd.Max)))
            cpu[kind].append(float(hvd.allreduce(np.array(dc), op=hvd.Average)))
    res = {"np": hvd.size(), "mode": "hvdlike", "loop": args.loop, "model": args.model,
           "batch_size_per_rank": args.batch_size,
           "threads": args.threads, "steps": args.steps, "repeats": args.repeats,
           "overlap": os.environ.get("HVDLIKE_OVERLAP", "1") != "0",
           "overlap_bucket": Settings.from_env().overlap_bucket}
    for kind, ts in times.items():
        step = float(np.min(ts))  # best of repeats: least disturbed by other load
        res[kind] = {"step_time_s": step, "median_step_time_s": float(np.median(ts)),
                     "step_times_s": ts, "cpu_s_per_step": float(np.median(cpu[kind])),
                     "img_per_s_per_rank": args.batch_size / step,
                     "img_per_s_total": args.batch_size * hvd.size() / step}
    res["overhead_ratio"] = res["distributed"]["step_time_s"] / res["plain"]["step_time_s"]
    # the gradients' all-reduce alone (one grouped call of the same bytes, NumPy: eager
    # TensorFlow would add its own cost per tensor), for the overlap
    grads = [np.zeros(v.shape, np.float32) for v in models["distributed"].trainable_variables]
    alone = []
    for _ in range(max(3, args.repeats)):
        hvd.barrier()
        t0 = time.perf_counter()
        core.grouped_allreduce(grads, name="bench.allreduce_alone")
        alone.append(float(hvd.allreduce(np.array(time.perf_counter() - t0), op=hvd.Max)))
    res["allreduce_alone_s"] = float(np.min(alone))
    # share of the all-reduce hidden behind compute: (plain + alone - distributed) / alone
    res["hidden_fraction"] = ((res["plain"]["step_time_s"] + res["allreduce_alone_s"]
                               - res["distributed"]["step_time_s"]) / res["allreduce_alone_s"])
    if hvd.rank() == 0:
        Path(args.json).write_text(json.dumps(res, indent=2))


def worker_mwms(args):
    """Native tf.distribute.MultiWorkerMirroredStrategy, started from the MPI world with
    hvdlike's TF_CONFIG emulation, on the same model, per-replica batch and threads. tf_keras:
    Keras 3 fit does not run under it (see scripts/compare_tf_distribute.py). Times a plain
    tf_keras model (no strategy) in the same job for its overhead ratio."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import socket
    import hvdlike as core
    from hvdlike.tensorflow import export_tf_config
    core.init()
    # test hosts have no DNS names: the driver passes name=address pairs
    addresses = dict(pair.split("=") for pair in
                     os.environ.get("BENCH_HOST_ADDRESSES", "").split(",") if pair)
    export_tf_config(host=addresses.get(socket.gethostname()))
    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    import tf_keras as keras
    n = core.size()
    shape, classes = ((224, 224, 3), 1000) if args.model == "resnet50" else ((28, 28, 1), 10)

    def build():
        m = build_model(keras, args.model, shape, classes)
        m.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=args.model != "resnet50"))
        return m

    def dataset(batch):
        rng = np.random.RandomState(core.rank())
        x = rng.uniform(size=(batch,) + shape).astype(np.float32)
        y = rng.randint(0, classes, size=(batch,)).astype(np.int64)
        ds = tf.data.Dataset.from_tensors((x, y)).repeat().prefetch(4)
        options = tf.data.Options()  # every worker feeds its own batches
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.OFF)
        return ds.with_options(options)

    with strategy.scope():
        models = {"distributed": build()}
    models["plain"] = build()  # outside the scope: no strategy, per-replica batch
    data = {"distributed": dataset(args.batch_size * n), "plain": dataset(args.batch_size)}
    for kind, m in models.items():
        m.fit(data[kind], steps_per_epoch=args.warmup, epochs=1, verbose=0)
    times, cpu = {k: [] for k in models}, {k: [] for k in models}
    for _ in range(args.repeats):
        for kind in ("plain", "distributed"):
            core.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            models[kind].fit(data[kind], steps_per_epoch=args.steps, epochs=1, verbose=0)
            dt = (time.perf_counter() - t0) / args.steps
            dc = (time.process_time() - c0) / args.steps
            times[kind].append(float(core.allreduce(np.array(dt), op=core.Max)))
            cpu[kind].append(float(core.allreduce(np.array(dc), op=core.Average)))
    res = {"np": n, "mode": "mwms", "model": args.model, "batch_size_per_rank": args.batch_size,
           "threads": args.threads, "steps": args.steps, "repeats": args.repeats,
           "overlap": None, "allreduce_alone_s": None, "hidden_fraction": None}
    for kind, ts in times.items():
        step = float(np.min(ts))
        res[kind] = {"step_time_s": step, "median_step_time_s": float(np.median(ts)),
                     "step_times_s": ts, "cpu_s_per_step": float(np.median(cpu[kind])),
                     "img_per_s_per_rank": args.batch_size / step,
                     "img_per_s_total": args.batch_size * n / step}
    res["overhead_ratio"] = res["distributed"]["step_time_s"] / res["plain"]["step_time_s"]
    if core.rank() == 0:
        Path(args.json).write_text(json.dumps(res, indent=2))


def driver(args):
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # OMP_NUM_THREADS as hvdlikerun sets it: otherwise each rank's OpenMP pool spins on
    # every core and the runs measure that
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_osc="^ucx", TF_CPP_MIN_LOG_LEVEL="2",
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(args.threads)),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    mpirun = Path(sys.executable).parent / "mpirun"
    results = []
    overlaps = {"on": ["1"], "off": ["0"], "both": ["1", "0"]}[args.overlap]
    runs = [(n, o) for n in [int(v) for v in args.nps.split(",")]
            for o in (overlaps if n > 1 else ["1"]) + (["mwms"] if args.mwms and n > 1 else [])]
    for n, overlap in runs:
        mode = "mwms" if overlap == "mwms" else "hvdlike"
        run_env = dict(env, HVDLIKE_OVERLAP="1" if mode == "mwms" else overlap)
        if args.timeline and mode == "hvdlike":
            run_env["HVDLIKE_TIMELINE"] = str(out / f"timeline_np{n}_overlap{overlap}.json")
        with tempfile.TemporaryDirectory() as d:
            js = Path(d) / "r.json"
            program = [sys.executable, __file__, "--worker", "--json", str(js),
                       "--batch-size", str(args.batch_size), "--steps", str(args.steps),
                       "--repeats", str(args.repeats), "--warmup", str(args.warmup),
                       "--threads", str(args.threads), "--model", args.model, "--mode", mode,
                       "--loop", args.loop]
            launcher = str(mpirun if mpirun.exists() else "mpirun")
            cluster = None
            if args.hosts_link and n > 1:
                from hvdlike.testing.cluster import Cluster
                link = None if args.hosts_link == "none" else args.hosts_link
                cluster = Cluster(hosts=n, link=link, prefix="hvdb", net=79).up()
                run_env["BENCH_HOST_ADDRESSES"] = ",".join(
                    f"{name}={a}" for name, a in zip(cluster.names, cluster.addresses))
                names = ["PYTHONPATH", "OMP_NUM_THREADS", "OMPI_MCA_osc",
                         "TF_CPP_MIN_LOG_LEVEL", "BENCH_HOST_ADDRESSES"] + sorted(
                             k for k in run_env if k.startswith("HVDLIKE_"))
                cmd = cluster.command_on(0, cluster.mpirun_argv(
                    launcher, [1] * n, program, [a for v in names for a in ("-x", v)]))
            else:
                cmd = [launcher, "-np", str(n), "--oversubscribe"] + program
            try:
                p = subprocess.run(cmd, env=run_env, cwd=REPO, text=True, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, timeout=args.timeout)
            finally:
                if cluster is not None:
                    cluster.down()
            if p.returncode != 0 or not js.exists():
                sys.exit(f"np={n} {mode} overlap={overlap} failed (rc={p.returncode}):\n{p.stdout[-4000:]}")
            results.append(json.loads(js.read_text()))
    base = next((r for r in results if r["np"] == 1), None)

    def label(r):
        return "mwms" if r["mode"] == "mwms" else ("on" if r["overlap"] else "off")

    for r in results:
        r["scaling_efficiency"] = (r["distributed"]["img_per_s_total"]
                                   / (r["np"] * base["distributed"]["img_per_s_total"])
                                   if base else None)
    hdr = (f"{'np':>3} {'run':>7} {'plain ms/step':>14} {'dist ms/step':>13} {'dist/plain':>10} "
           f"{'CPU ms plain/dist':>17} {'img/s/rank':>11} {'img/s total':>12} "
           f"{'scaling eff.':>13} {'allreduce ms':>13} {'hidden':>7}")
    lines = [hdr, "-" * len(hdr)]
    for r in results:
        eff = r["scaling_efficiency"]
        hidden = "" if r["hidden_fraction"] is None or r["np"] == 1 else (
            f"{100 * r['hidden_fraction']:.0f}%")
        alone = "" if r["allreduce_alone_s"] is None else f"{1e3 * r['allreduce_alone_s']:.1f}"
        cpu = (f"{1e3 * r['plain']['cpu_s_per_step']:.2f} / "
               f"{1e3 * r['distributed']['cpu_s_per_step']:.2f}")
        lines.append(f"{r['np']:>3} {label(r):>7} "
                     f"{1e3 * r['plain']['step_time_s']:>14.2f} "
                     f"{1e3 * r['distributed']['step_time_s']:>13.2f} "
                     f"{r['overhead_ratio']:>10.3f} "
                     f"{cpu:>17} "
                     f"{r['distributed']['img_per_s_per_rank']:>11.0f} "
                     f"{r['distributed']['img_per_s_total']:>12.0f} "
                     f"{'' if eff is None else f'{100 * eff:.1f}%':>13} "
                     f"{alone:>13} "
                     f"{hidden:>7}")
    for r in results:  # hvdlike (overlap on) against native MWMS on the same world size
        native = next((m for m in results if m["mode"] == "mwms" and m["np"] == r["np"]), None)
        if native is not None and r["mode"] == "hvdlike" and r["overlap"]:
            r["vs_mwms"] = (r["distributed"]["img_per_s_total"]
                            / native["distributed"]["img_per_s_total"])
            lines.append(f"np={r['np']}: hvdlike (overlap on) img/s / native MWMS img/s = "
                         f"{r['vs_mwms']:.2f}")
    table = "\n".join(lines)
    what = {"resnet50": "ResNet-50 224x224", "mlp": "48-layer MLP"}.get(args.model, "small CNN")
    where = (f", {args.hosts_link} links between test hosts (1 rank each)" if args.hosts_link
             else "")
    loop = "Keras fit" if args.loop == "fit" else "tf.function step with DistributedGradientTape"
    print(f"{what}, {loop}, batch {args.batch_size}/rank, {args.threads} thread(s)/rank"
          f"{where}")
    print("hidden: share of the all-reduce alone that the step did not add, "
          "(plain + all-reduce - distributed) / all-reduce")
    print("CPU: process CPU time a step per rank, all its threads (median of the repeats, "
          "mean of the ranks)")
    print(table)
    (out / "bench_train.json").write_text(json.dumps(results, indent=2))
    try:
        with figure(out / "bench_train.png", 1, 2, figsize=(10, 4), dpi=100) as (fig, (a1, a2)):
            nps = [f"{r['np']}" + ("" if r["np"] == 1 else f" ({label(r)})") for r in results]
            xs = range(len(nps))
            a1.bar([i - 0.2 for i in xs], [r["plain"]["img_per_s_total"] for r in results], 0.4,
                   label="plain optimizer (no communication)")
            a1.bar([i + 0.2 for i in xs], [r["distributed"]["img_per_s_total"] for r in results],
                   0.4, label="DistributedOptimizer")
            a1.set_xticks(list(xs), [f"np={n}" for n in nps], fontsize=8)
            a1.set_ylabel("img/s (total)")
            a1.legend(fontsize=8)
            a1.set_title(f"Throughput, {what} (overlap on/off, mwms: native)", fontsize=9)
            a2.bar(list(xs), [r["overhead_ratio"] for r in results])
            a2.axhline(1.05, color="r", ls="--", label="+5%")
            a2.set_xticks(list(xs), [f"np={n}" for n in nps], fontsize=8)
            a2.set_ylabel("step time, distributed / plain")
            a2.set_title("Overhead vs plain optimizer (same run)")
            a2.legend(fontsize=8)
        print(f"wrote {out / 'bench_train.json'} and {out / 'bench_train.png'}")
    except ImportError:
        print(f"wrote {out / 'bench_train.json'} (matplotlib not installed: no PNG)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nps", default="1,2", help="comma-separated world sizes")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=50, help="steps per timed fit call")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", choices=("cnn", "resnet50", "mlp"), default="cnn")
    p.add_argument("--loop", choices=("fit", "tape"), default="fit",
                   help="Keras fit with DistributedOptimizer, or a tf.function step with "
                        "DistributedGradientTape (hvdlike runs; MWMS runs always use fit)")
    p.add_argument("--overlap", choices=("on", "off", "both"), default="on",
                   help="HVDLIKE_OVERLAP for runs with more than one rank")
    p.add_argument("--hosts-link", metavar="RATE",
                   help="run each multi-rank run as that many test hosts x 1 rank "
                        "(hvdlike.testing.cluster, root only) with links shaped to RATE "
                        "(e.g. 1gbit; 'none': unshaped)")
    p.add_argument("--mwms", action="store_true",
                   help="also run native MultiWorkerMirroredStrategy (tf_keras, TF_CONFIG from "
                        "hvdlike's emulation) for each world size > 1")
    p.add_argument("--timeline", action="store_true",
                   help="write each run's timeline (HVDLIKE_TIMELINE) into --out")
    p.add_argument("--out", default=str(REPO / "results" / "bench_train"))
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="hvdlike", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker_mwms(args) if args.mode == "mwms" else worker(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
