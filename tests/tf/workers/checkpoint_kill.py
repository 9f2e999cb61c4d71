"""A rank killed while it writes a checkpoint leaves the previous checkpoint intact.

``checkpoint_kill.py PATH``: trains on every rank with hvdlike's ModelCheckpoint (rank 0
writes ``PATH``, weights only, every epoch); a layer makes rank 0 exit abruptly in the middle
of writing the second checkpoint. Rank 0 prints the sum of the weights it saved first.
``checkpoint_kill.py PATH --verify``: loads ``PATH`` into a fresh model and prints that sum.
"""
import os
import sys

from common import hvd, np, tf  # noqa: F401

from hvdlike.tensorflow import compat
import hvdlike.keras as hvdk

keras = compat.keras()


class Saboteur(keras.layers.Layer):
    """Identity with one weight; writing it the second time kills the process half-way."""

    saves = 0

    def build(self, input_shape):
        self.w = self.add_weight(shape=(4,), initializer="ones", name="w")

    def call(self, x):
        return x + 0.0 * tf.reduce_sum(self.w)

    def save_own_variables(self, store):
        Saboteur.saves += 1
        if Saboteur.saves == 2 and not VERIFY:
            os._exit(3)  # killed in the middle of writing the file
        super().save_own_variables(store)


def model():
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), Saboteur(),
                          keras.layers.Dense(1)])
    m.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    return m


def total(m):
    return float(sum(np.sum(w) for w in m.get_weights()))


PATH, VERIFY = sys.argv[1], "--verify" in sys.argv
m = model()
if VERIFY:
    m.load_weights(PATH)
    print(f"LOADED_SUM {total(m):.6f}", flush=True)
    sys.exit(0)


class PrintSaved(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0 and hvd.rank() == 0:
            print(f"SAVED_SUM {total(self.model):.6f}", flush=True)


x = np.random.RandomState(hvd.rank()).normal(size=(64, 4)).astype(np.float32)
m.fit(x, x[:, :1], batch_size=16, epochs=3, verbose=0,
      callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvdk.callbacks.ModelCheckpoint(PATH, save_weights_only=True), PrintSaved()])
