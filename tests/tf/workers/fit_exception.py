"""Rank 1 raises in the middle of Keras ``fit`` (a callback at batch 2 of epoch 0); the
other ranks are inside the same fit, waiting in its all-reduces. Prints ``RAISING at <t>``."""
import time

from common import hvd, np, tf  # noqa: F401

from hvdlike.tensorflow import compat
import hvdlike.tensorflow.keras as hvdk

keras = compat.keras()


class Raise(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if hvd.rank() == 1 and batch == 2:
            print(f"RAISING at {time.time()}", flush=True)
            raise RuntimeError("rank 1 fails in the middle of fit")


model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
x = np.ones((64, 4), np.float32)
model.fit(x, x[:, :1], batch_size=4, epochs=3, verbose=0, callbacks=[Raise()])
print("FINISHED", flush=True)
