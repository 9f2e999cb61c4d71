"""The tf.distribute MultiWorkerMirroredStrategy Keras example, run by hvdlike under MPI.

    mpirun -np 2 python examples/strategy_keras_mnist.py        # hvdlike MPIStrategy
    python examples/strategy_keras_mnist.py                     # one process (size 1)
    mpirun -np 2 python examples/strategy_keras_mnist.py --native   # TF's own strategy
                                                                    # (TF_USE_LEGACY_KERAS=1)

The only line that differs from the tf.distribute tutorial is the one creating the
strategy: ``hvd.MPIStrategy()`` instead of ``tf.distribute.MultiWorkerMirroredStrategy()``
(which would need a hand-written TF_CONFIG on every node).  ``--native`` keeps TF's strategy
and writes TF_CONFIG from the MPI world with ``hvd.export_tf_config()``; with Keras 3 its
``model.fit`` fails in TF 2.21 (use ``TF_USE_LEGACY_KERAS=1``).  Data: MNIST-shaped
synthetic images (``--data mnist.npz`` for the real thing); global batch 64 x replicas.
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402

import hvdlike.tensorflow as hvd  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--steps", type=int, default=50, help="steps per epoch")
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--per-replica-batch", type=int, default=64)
p.add_argument("--data", help="Keras-format mnist.npz (default: synthetic)")
p.add_argument("--native", action="store_true",
               help="tf.distribute.MultiWorkerMirroredStrategy via hvd.export_tf_config()")
args = p.parse_args()

if args.native:
    hvd.export_tf_config()          # TF_CONFIG from the MPI world, before TF starts

import tensorflow as tf  # noqa: E402

from hvdlike.tensorflow.compat import keras as _keras  # noqa: E402

keras = _keras()
tf.config.threading.set_intra_op_parallelism_threads(1)
# two inter-op threads: one runs the step, one its collectives, so that they overlap
# (docs/performance.md)
tf.config.threading.set_inter_op_parallelism_threads(2)

# ----- the one changed line -------------------------------------------------------------
strategy = tf.distribute.MultiWorkerMirroredStrategy() if args.native else hvd.MPIStrategy()
# ----------------------------------------------------------------------------------------
rank = strategy.cluster_resolver.task_id
global_batch = args.per_replica_batch * strategy.num_replicas_in_sync


def mnist_dataset():
    if args.data:
        with np.load(args.data) as f:
            x, y = (f["x_train"][..., None] / 255.0).astype(np.float32), f["y_train"]
    else:
        protos = np.random.RandomState(0).uniform(0, 1, size=(10, 28, 28, 1)).astype(np.float32)
        rng = np.random.RandomState(1)
        y = rng.randint(0, 10, size=args.steps * global_batch).astype(np.int64)
        x = np.clip(protos[y] + rng.normal(0, 0.6, size=(len(y), 28, 28, 1)), 0, 1)
        x = x.astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch, drop_remainder=True)


def build_and_compile():
    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.SGD(learning_rate=0.01),
                  metrics=["accuracy"])
    return model


with strategy.scope():
    model = build_and_compile()
history = model.fit(mnist_dataset(), epochs=args.epochs, steps_per_epoch=args.steps,
                    verbose=2 if rank == 0 else 0)

if strategy.extended.should_checkpoint:          # chief-only checkpointing
    print(f"chief (task {rank}) would save the model here", flush=True)

weights = np.concatenate([w.ravel() for w in model.get_weights()])
diff = max(float(np.max(np.abs(w - weights))) for w in hvd.allgather_object(weights))
if rank == 0:
    print(f"replicas: {strategy.num_replicas_in_sync}  global batch: {global_batch}  "
          f"final loss: {history.history['loss'][-1]:.4f}")
    print(f"max weight difference between ranks: {diff}")
