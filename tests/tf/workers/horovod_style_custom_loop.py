# A training script written in Horovod's documented TF2 custom-loop style
# (horovod/examples/tensorflow2/tensorflow2_mnist.py).  Only the import line
# differs: `import horovod.tensorflow as hvd` -> `import hvdlike.tensorflow as hvd`.
# Runs under Keras 3 and tf_keras (TF_USE_LEGACY_KERAS=1, the Keras Horovod documents):
# Keras 3 made `opt.variables()` a property holding a list, which hvdlike makes callable.
# Data: synthetic arrays instead of tf.keras.datasets.mnist.load_data() (no internet here).
import numpy as np
import tensorflow as tf
import hvdlike.tensorflow as hvd

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
    tf.keras.layers.Conv2D(8, [3, 3], activation='relu'),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(32, activation='relu'),
    tf.keras.layers.Dense(10, activation='softmax')
])
loss = tf.losses.SparseCategoricalCrossentropy()

# the learning rate grows with the number of ranks
opt = tf.optimizers.Adam(0.001 * hvd.size())


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        probs = mnist_model(images, training=True)
        loss_value = loss(labels, probs)

    # gradients averaged over the ranks
    tape = hvd.DistributedGradientTape(tape)

    grads = tape.gradient(loss_value, mnist_model.trainable_variables)
    opt.apply_gradients(zip(grads, mnist_model.trainable_variables))

    # after the first step (the optimizer's slots exist by then): rank 0's model and
    # optimizer state everywhere
    if first_batch:
        hvd.broadcast_variables(mnist_model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables(), root_rank=0)

    return loss_value


# fewer steps per rank the more ranks there are
for batch, (images, labels) in enumerate(dataset.take(40 // hvd.size())):
    loss_value = training_step(images, labels, batch == 0)

    if batch % 10 == 0 and hvd.local_rank() == 0:
        print('Step #%d\tLoss: %.6f' % (batch, loss_value))

weights = hvd.allgather_object([w.numpy().sum() for w in mnist_model.variables])
assert all(np.array_equal(w, weights[0]) for w in weights), "ranks differ"
slots = hvd.allgather_object([np.asarray(v).sum() for v in opt.variables()])
assert len(slots[0]) > 1 and all(np.array_equal(s, slots[0]) for s in slots), "optimizers differ"
print(f"HOROVOD_STYLE_CUSTOM_LOOP_OK rank={hvd.rank()}", flush=True)
