"""A tf.distribute custom training loop (strategy.run + strategy.reduce) under MPI.

    mpirun -np 2 python examples/strategy_custom_loop.py
    python examples/strategy_custom_loop.py          # one process

Written exactly as for tf.distribute.MultiWorkerMirroredStrategy: the dataset is
distributed with ``distribute_datasets_from_function`` (each rank reads its own shard, the
per-replica batch comes from the input context), the loss is averaged over the global
batch with ``tf.nn.compute_average_loss``, the optimizer all-reduces the gradients through
the strategy (hvdlike's fused MPI all-reduce), and ``strategy.reduce`` sums the loss.
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdlike.tensorflow as hvd  # noqa: E402
from hvdlike.tensorflow.compat import keras as _keras  # noqa: E402

keras = _keras()
p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--steps", type=int, default=100)
p.add_argument("--per-replica-batch", type=int, default=64)
args = p.parse_args()
tf.config.threading.set_intra_op_parallelism_threads(1)
# two inter-op threads: one runs the step, one its collectives, so that they overlap
# (docs/performance.md)
tf.config.threading.set_inter_op_parallelism_threads(2)

strategy = hvd.MPIStrategy()            # was: tf.distribute.MultiWorkerMirroredStrategy()
GLOBAL_BATCH = args.per_replica_batch * strategy.num_replicas_in_sync
rank = strategy.cluster_resolver.task_id


def dataset_fn(ctx):
    rng = np.random.RandomState(1000 + ctx.input_pipeline_id)   # this rank's own shard
    n = args.steps * ctx.get_per_replica_batch_size(GLOBAL_BATCH)
    x = rng.normal(size=(n, 20)).astype(np.float32)
    y = (x @ np.linspace(-1, 1, 20, dtype=np.float32)[:, None] > 0).astype(np.int64)[:, 0]
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(
        ctx.get_per_replica_batch_size(GLOBAL_BATCH), drop_remainder=True)


with strategy.scope():
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(2)])
    optimizer = keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

dist_ds = strategy.distribute_datasets_from_function(dataset_fn)


@tf.function
def train_step(x, y):
    def step_fn(x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)),
                                              global_batch_size=GLOBAL_BATCH)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return strategy.reduce("SUM", strategy.run(step_fn, args=(x, y)), axis=None)


for step, (x, y) in enumerate(dist_ds):
    loss = train_step(x, y)
    if rank == 0 and (step % 20 == 0 or step == args.steps - 1):
        print(f"step {step:4d}  global loss {float(loss):.4f}", flush=True)

weights = np.concatenate([w.ravel() for w in model.get_weights()])
diff = max(float(np.max(np.abs(w - weights))) for w in hvd.allgather_object(weights))
if rank == 0:
    print(f"max weight difference between ranks: {diff}")
