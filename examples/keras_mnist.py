"""Train a small CNN on MNIST-shaped images with Keras model.fit on N ranks.

    mpirun -np 2 python examples/keras_mnist.py                 # synthetic data
    mpirun -np 2 python examples/keras_mnist.py --data mnist.npz  # real MNIST
    python examples/keras_mnist.py                              # one process

``--data`` points at a Keras-format ``mnist.npz`` (x_train, y_train, x_test, y_test).
Each rank reads a disjoint shard of the data; the global batch is
``--batch-size * size()`` and the learning rate is scaled by ``size()`` (with a
warmup), as usual for synchronous data parallelism.  Rank 0 prints Keras's progress
bar with metrics averaged over ranks.
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdlike.keras as hvd  # noqa: E402
from hvdlike.tensorflow.compat import keras as _keras  # noqa: E402

keras = _keras()


def synthetic_mnist(n, seed):
    """Learnable MNIST-shaped data: a fixed random prototype per class plus noise."""
    protos = np.random.RandomState(0).uniform(0, 1, size=(10, 28, 28, 1)).astype(np.float32)
    rng = np.random.RandomState(seed)
    y = rng.randint(0, 10, size=n).astype(np.int64)
    x = np.clip(protos[y] + rng.normal(0, 0.6, size=(n, 28, 28, 1)), 0, 1).astype(np.float32)
    return x, y


def load_data(args):
    if args.data:
        with np.load(args.data) as f:
            x, y = f["x_train"], f["y_train"]
            xt, yt = f["x_test"], f["y_test"]
        prep = lambda a: (a[..., None] / 255.0).astype(np.float32)  # noqa: E731
        return (prep(x), y.astype(np.int64)), (prep(xt), yt.astype(np.int64))
    return synthetic_mnist(args.train_size, 1), synthetic_mnist(args.train_size // 6, 2)


def make_dataset(x, y, batch_size, shuffle):
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = hvd.shard_dataset(ds, policy="DATA")  # rank r keeps elements r, r+size, ...
    if shuffle:
        ds = ds.shuffle(10000, seed=hvd.rank())
    # drop_remainder: every rank must run the same number of steps
    return ds.batch(batch_size, drop_remainder=True).prefetch(2)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", help="path to mnist.npz (default: synthetic data)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per-rank batch size")
    p.add_argument("--lr", type=float, default=0.001, help="single-process learning rate")
    p.add_argument("--train-size", type=int, default=12288, help="synthetic train images")
    p.add_argument("--threads", type=int, default=1, help="TF intra-op threads per rank")
    p.add_argument("--checkpoint-dir", help="save checkpoints here (rank 0 only)")
    args = p.parse_args()

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    # two inter-op threads: one runs the step, one its collectives, so that they overlap
    # (docs/performance.md)
    tf.config.threading.set_inter_op_parallelism_threads(2)

    (x, y), (xt, yt) = load_data(args)
    train = make_dataset(x, y, args.batch_size, shuffle=True)
    val = make_dataset(xt, yt, args.batch_size, shuffle=False)

    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    scaled_lr = args.lr * hvd.size()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(scaled_lr))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1),
    ]
    if args.checkpoint_dir:
        callbacks.append(hvd.callbacks.ModelCheckpoint(
            os.path.join(args.checkpoint_dir, "checkpoint-{epoch}.keras")))

    if hvd.rank() == 0:
        print(f"ranks={hvd.size()} per-rank batch={args.batch_size} "
              f"global batch={args.batch_size * hvd.size()} lr={scaled_lr:g} "
              f"data={'synthetic' if not args.data else args.data}", flush=True)
    model.fit(train, epochs=args.epochs, validation_data=val, callbacks=callbacks, shuffle=False,
              verbose=1 if hvd.rank() == 0 else 0)
    loss, acc = model.evaluate(val, verbose=0)
    loss, acc = (float(v) for v in hvd.allreduce(np.array([loss, acc])))  # noqa: F841
    if hvd.rank() == 0:
        print(f"final: val_loss={loss:.4f} val_accuracy={acc:.4f}", flush=True)


if __name__ == "__main__":
    main()
