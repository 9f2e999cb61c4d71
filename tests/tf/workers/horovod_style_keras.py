# A training script written in Horovod's documented TF2 Keras style
# (horovod/examples/tensorflow2/tensorflow2_keras_mnist.py).  Only the import line
# differs: `import horovod.tensorflow.keras as hvd` -> `import hvdlike.tensorflow.keras as hvd`.
# Data: synthetic arrays instead of tf.keras.datasets.mnist.load_data() (no internet here).
import sys

import numpy as np
import tensorflow as tf
import hvdlike.tensorflow.keras as hvd

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
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

# Horovod: adjust learning rate based on number of GPUs.
scaled_lr = 0.001 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(
    opt, backward_passes_per_step=1, average_aggregated_gradients=True)

# Horovod: Specify `experimental_run_tf_function=False` to ensure TensorFlow
# uses hvd.DistributedOptimizer() to compute gradients.
compile_kwargs = {}
if "--legacy" in sys.argv:
    compile_kwargs["experimental_run_tf_function"] = False
mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
                    optimizer=opt,
                    metrics=['accuracy'],
                    **compile_kwargs)

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),

    # Horovod: average metrics among workers at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),

    # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
    # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
    # the first three epochs.
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1, verbose=1),
]

# Horovod: write logs on worker 0.
verbose = 1 if hvd.rank() == 0 else 0

# Train the model.
history = mnist_model.fit(dataset, steps_per_epoch=20 // hvd.size(), callbacks=callbacks,
                          epochs=2, verbose=verbose)

weights = hvd.allgather_object([w.sum() for w in mnist_model.get_weights()])
assert all(np.allclose(w, weights[0], rtol=0, atol=0) for w in weights), "ranks differ"
print(f"HOROVOD_STYLE_KERAS_OK rank={hvd.rank()} loss={history.history['loss'][-1]:.4f}",
      flush=True)
