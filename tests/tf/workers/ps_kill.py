"""``ps_kill.py server|worker``: parameter-server training (np=3: rank 2 serves, ranks 0
and 1 work) in which the server or worker 1 SIGKILLs itself after a few pushes; prints
``KILLING rank=<r> at <t>`` first."""
import os
import signal
import sys
import time

from common import hvd, np, tf  # noqa: F401

from hvdlike.tensorflow import compat

keras = compat.keras()
victim = sys.argv[1]
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
ps = hvd.ParameterServerTraining(model, keras.optimizers.SGD(0.1), total_steps=10_000)
if victim == "server" and ps.is_server:
    server = ps._server
    real_apply = server._apply

    def apply_then_die(*args):
        real_apply(*args)
        if server.pushes_applied == 5:
            print(f"KILLING rank={hvd.rank()} at {time.time()}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    server._apply = apply_then_die


class Die(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if victim == "worker" and ps.worker_index == 1 and batch == 5:
            print(f"KILLING rank={hvd.rank()} at {time.time()}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


model.compile(optimizer=ps.optimizer, loss="mse")
x = np.ones((32, 4), np.float32)
ps.run(lambda: model.fit(x, x[:, :1], batch_size=4, epochs=1000, verbose=0,
                         callbacks=[ps.callback(), Die()]))
print("FINISHED", flush=True)
