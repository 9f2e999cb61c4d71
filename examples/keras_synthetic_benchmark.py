"""Synthetic training throughput benchmark (img/sec per rank and in total).

    mpirun -np 2 python examples/keras_synthetic_benchmark.py                  # small CNN
    mpirun -np 2 python examples/keras_synthetic_benchmark.py --model ResNet50 \
        --batch-size 8 --image-size 224
    python examples/keras_synthetic_benchmark.py                               # one process

Random images and labels; the model trains with a DistributedGradientTape step
compiled by tf.function (``--fit`` uses Keras model.fit with DistributedOptimizer).
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdlike.keras as hvd  # noqa: E402
from hvdlike.tensorflow.compat import keras as _keras  # noqa: E402

keras = _keras()


def small_cnn(shape, classes):
    return keras.Sequential([
        keras.Input(shape),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(classes),
    ])


def build_model(name, image_size, classes):
    if name.lower() == "cnn":
        return small_cnn((image_size, image_size, 1), classes)
    app = getattr(keras.applications, name, None)
    if app is None:
        raise SystemExit(f"unknown --model {name!r}: use cnn or a keras.applications name")
    return app(weights=None, input_shape=(image_size, image_size, 3), classes=classes)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="cnn", help="cnn (MNIST-shaped) or a keras.applications "
                   "model name, e.g. ResNet50")
    p.add_argument("--batch-size", type=int, default=64, help="per-rank batch size")
    p.add_argument("--image-size", type=int, default=None,
                   help="default 28 for cnn, 224 otherwise")
    p.add_argument("--num-warmup-batches", type=int, default=5)
    p.add_argument("--num-batches-per-iter", type=int, default=10)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="TF intra-op threads per rank")
    p.add_argument("--fp16-allreduce", action="store_true", help="Compression.fp16")
    p.add_argument("--fit", action="store_true", help="use model.fit + DistributedOptimizer")
    args = p.parse_args()

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    # two inter-op threads: one runs the step, one its collectives, so that they overlap
    # (docs/performance.md)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    size = args.image_size or (28 if args.model.lower() == "cnn" else 224)
    channels = 1 if args.model.lower() == "cnn" else 3
    classes = 10 if args.model.lower() == "cnn" else 1000
    model = build_model(args.model, size, classes)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    rng = np.random.RandomState(hvd.rank())
    images = tf.constant(rng.uniform(size=(args.batch_size, size, size, channels)), tf.float32)
    labels = tf.constant(rng.randint(0, classes, size=(args.batch_size,)), tf.int64)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=args.model == "cnn")
    opt = keras.optimizers.SGD(0.01)

    if args.fit:
        model.compile(optimizer=hvd.DistributedOptimizer(opt, compression=compression),
                      loss=loss_fn)
        ds = tf.data.Dataset.from_tensors((images, labels)).repeat()

        def run(n):
            model.fit(ds, steps_per_epoch=n, epochs=1, verbose=0, shuffle=False)
    else:
        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(images, training=True))
            tape = hvd.DistributedGradientTape(tape, compression=compression)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

        def run(n):
            for _ in range(n):
                step()
        opt.build(model.trainable_variables)
    hvd.broadcast_variables(model.variables, root_rank=0)

    def log(s):
        if hvd.rank() == 0:
            print(s, flush=True)

    log(f"Model: {args.model}, batch size per rank: {args.batch_size}, ranks: {hvd.size()}, "
        f"threads per rank: {args.threads}, mode: {'fit' if args.fit else 'custom loop'}")
    run(args.num_warmup_batches)
    rates = []
    for i in range(args.num_iters):
        t0 = time.perf_counter()
        run(args.num_batches_per_iter)
        dt = time.perf_counter() - t0
        rates.append(args.batch_size * args.num_batches_per_iter / dt)
        log(f"Iter #{i}: {rates[-1]:.1f} img/sec per rank")
    mean, conf = np.mean(rates), 1.96 * np.std(rates)
    per_rank = hvd.allgather_object(float(mean))
    log(f"Img/sec per rank: {mean:.1f} +-{conf:.1f} (rank 0); all ranks: "
        f"{', '.join(f'{v:.1f}' for v in per_rank)}")
    log(f"Total img/sec on {hvd.size()} rank(s): {sum(per_rank):.1f}")


if __name__ == "__main__":
    main()
