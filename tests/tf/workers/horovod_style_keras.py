# A training script written in Horovod's documented TF2 Keras style
# (horovod/examples/tensorflow2/tensorflow2_keras_mnist.py).  Only the import line
# differs: `import horovod.tensorflow.keras as hvd` -> `import hvdlike.tensorflow.keras as hvd`.
# Data: synthetic arrays instead of tf.keras.datasets.mnist.load_data() (no internet here).

import numpy as np
import tensorflow as tf
import hvdlike.tensorflow.keras as hvd

# one process per rank
hvd.init()

# each rank on its own GPU, if any
gpus = tf.config.experimental.list_physical_devices('GPU')
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

rng = np.random.RandomState(hvd.rank())
mnist_images = rng.randint(0, 255, size=(512, 28, 28)).astype(np.uint8)
mnist_labels = rng.randint(0, 10, size=(512,)).astype(np.uint8)

dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32),
     tf.cast(mnist_labels, tf.int64))
)
dataset = dataset.repeat().shuffle(10000).batch(32)

mnist_model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(8, [3, 3], activation='relu', input_shape=(28, 28, 1)),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(32, activation='relu'),
    tf.keras.layers.Dense(10, activation='softmax')
])

# the learning rate grows with the number of ranks
scaled_lr = 0.001 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)

# gradients averaged over the ranks
opt = hvd.DistributedOptimizer(
    opt, backward_passes_per_step=1, average_aggregated_gradients=True)

# as in Horovod's example (Keras 3 removed the argument; with a DistributedOptimizer
# hvdlike lets compile take it and drops it)
mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
                    optimizer=opt,
                    metrics=['accuracy'],
                    experimental_run_tf_function=False)

callbacks = [
    # rank 0's starting weights everywhere
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),

    # epoch metrics averaged over the ranks
    hvd.callbacks.MetricAverageCallback(),

    # ramp the scaled learning rate up over the first epoch
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1, verbose=1),
]

# progress printed by rank 0 only
verbose = 1 if hvd.rank() == 0 else 0

history = mnist_model.fit(dataset, steps_per_epoch=20 // hvd.size(), callbacks=callbacks,
                          epochs=2, verbose=verbose)

weights = hvd.allgather_object([w.sum() for w in mnist_model.get_weights()])
assert all(np.allclose(w, weights[0], rtol=0, atol=0) for w in weights), "ranks differ"
print(f"HOROVOD_STYLE_KERAS_OK rank={hvd.rank()} loss={history.history['loss'][-1]:.4f}",
      flush=True)
