"""Custom TensorFlow training loop with DistributedGradientTape on N ranks.

    mpirun -np 2 python examples/tf_custom_loop.py                  # synthetic data
    mpirun -np 2 python examples/tf_custom_loop.py --data mnist.npz
    python examples/tf_custom_loop.py                               # one process

Each rank trains on its shard with a per-rank batch; gradients are averaged over
ranks inside the compiled step; rank 0's initial weights are broadcast first so all
ranks stay identical.
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdlike.tensorflow as hvd  # noqa: E402
from hvdlike.tensorflow.compat import keras as _keras  # noqa: E402

keras = _keras()


def load_data(path, n):
    if path:
        with np.load(path) as f:
            return (f["x_train"][..., None] / 255.0).astype(np.float32), \
                f["y_train"].astype(np.int64)
    protos = np.random.RandomState(0).uniform(0, 1, size=(10, 28, 28, 1)).astype(np.float32)
    rng = np.random.RandomState(1)
    y = rng.randint(0, 10, size=n).astype(np.int64)
    x = np.clip(protos[y] + rng.normal(0, 0.6, size=(n, 28, 28, 1)), 0, 1).astype(np.float32)
    return x, y


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", help="path to mnist.npz (default: synthetic data)")
    p.add_argument("--steps", type=int, default=200, help="training steps")
    p.add_argument("--batch-size", type=int, default=64, help="per-rank batch size")
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    # two inter-op threads: one runs the step, one its collectives, so that they overlap
    # (docs/performance.md)
    tf.config.threading.set_inter_op_parallelism_threads(2)

    x, y = load_data(args.data, 8192)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = hvd.shard_dataset(ds).repeat().shuffle(4096, seed=hvd.rank())
    ds = ds.batch(args.batch_size, drop_remainder=True)

    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = keras.optimizers.Adam(args.lr * hvd.size())
    opt.build(model.trainable_variables)
    # Start every rank from rank 0's weights and optimizer state.
    hvd.broadcast_variables(list(model.variables) + list(opt.variables), root_rank=0)

    @tf.function
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = loss_fn(labels, logits)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        acc = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32))
        return hvd.allreduce(tf.stack([loss, acc]))  # averaged over ranks for printing

    for step, (images, labels) in enumerate(ds.take(args.steps)):
        loss, acc = train_step(images, labels).numpy()
        if hvd.rank() == 0 and (step % 20 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss:.4f}  accuracy {acc:.4f}", flush=True)
    if hvd.rank() == 0:
        print("done", flush=True)


if __name__ == "__main__":
    main()
