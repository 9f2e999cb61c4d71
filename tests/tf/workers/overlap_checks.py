"""Gradients go to the engine while backprop goes on: read from each rank's timeline.

The model's backward pass has a slow stretch (an identity whose gradient sleeps SLOW s)
between its last layers and its first layer. With HVDLIKE_OVERLAP on (the default), the
last layers' gradients must be submitted, and all-reduced, while that stretch still runs;
with HVDLIKE_OVERLAP=0 every gradient goes to the engine after the backward pass. The job
sets HVDLIKE_TIMELINE; each rank reads its own file.
"""
import json
import os
import time

from common import check, close, hvd, np, tf

import keras

# TensorFlow runs a graph's ready ops on its inter-op threads; with one, the slow op would
# hold it and nothing else could run meanwhile (training jobs have one per core)
tf.config.threading.set_inter_op_parallelism_threads(2)

r, n = hvd.rank(), hvd.size()
SLOW = 0.4
OVERLAP = os.environ.get("HVDLIKE_OVERLAP", "1") != "0"
TRANSPORT = ("SHM_ALLREDUCE", "MPI_ALLREDUCE")


@tf.custom_gradient
def slow_backward(x):
    def grad(dy):
        def sleep_then(d):
            time.sleep(SLOW)
            return d
        out = tf.numpy_function(sleep_then, [dy], dy.dtype, stateful=False)
        out.set_shape(dy.shape)
        return out
    return tf.identity(x), grad


def train(steps):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, name="first")(inputs)
    h = keras.layers.Lambda(slow_backward)(h)
    h = keras.layers.Dense(16, activation="relu", name="middle")(h)
    outputs = keras.layers.Dense(1, name="last")(h)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    x = np.random.default_rng(r).normal(size=(4 * steps, 8)).astype(np.float32)
    model.fit(x, x[:, :1], batch_size=4, epochs=1, shuffle=False, verbose=0)


@check("gradients_overlap_backprop_as_the_timeline_shows")
def _():
    steps = 4
    train(steps)
    hvd.stop_timeline()
    root, ext = os.path.splitext(os.environ["HVDLIKE_TIMELINE"])
    with open(f"{root}.rank{r}{ext}") as f:
        events = json.load(f)
    step_spans = [e for e in events if e["name"] == "STEP"]
    assert len(step_spans) == steps, [e["name"] for e in events][:50]
    for step in step_spans[1:]:  # the first one also traced the function
        begin, end = step["ts"], step["ts"] + step["dur"]
        inside = [e for e in events if e.get("ph") == "X" and begin <= e["ts"] <= end]
        submits = sorted(e["ts"] for e in inside if e["name"] == "QUEUED")
        moved = [e for e in inside if e["name"] in TRANSPORT]
        assert submits and moved, inside
        last_submit = submits[-1]
        done_early = [e for e in moved if e["ts"] + e["dur"] < last_submit]
        if OVERLAP:
            # 6 gradients, one request each; the last layers' ones went (and were reduced)
            # during the slow stretch, before the first layer's could be submitted
            assert len(submits) == 6, submits
            assert last_submit - submits[0] > 0.75 * SLOW * 1e6, submits
            assert done_early, (submits, moved)
        else:
            assert len(submits) == 1, submits  # one grouped request after backprop
            assert not done_early, (submits, moved)


close()
