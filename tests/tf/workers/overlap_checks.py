"""Gradients go to the engine while backprop goes on: read from each rank's timeline.

The model's backward pass has a slow stretch (an identity whose gradient sleeps SLOW s)
between its last layers and its first layer. With HVDLIKE_OVERLAP on (the default), the
last layers' gradients must be submitted, and all-reduced, while that stretch still runs:
as one bucket of the default HVDLIKE_OVERLAP_BUCKET (the middle layer's kernel alone is
1 MiB, so the bucket closes there), or one request per gradient with
HVDLIKE_OVERLAP_BUCKET=0. With HVDLIKE_OVERLAP=0 every gradient goes to the engine after the
backward pass. The job sets HVDLIKE_TIMELINE; each rank reads its own file.
"""
import json
import os
import time

from common import check, close, hvd, np, tf

import keras
from hvdlike.engine.timeline import rank_file

# TensorFlow runs a graph's ready ops on its inter-op threads; with one, the slow op would
# hold it and nothing else could run meanwhile (training jobs have one per core)
tf.config.threading.set_inter_op_parallelism_threads(2)

r, n = hvd.rank(), hvd.size()
SLOW = 0.4
OVERLAP = os.environ.get("HVDLIKE_OVERLAP", "1") != "0"
EACH_ALONE = os.environ.get("HVDLIKE_OVERLAP_BUCKET") == "0"
WIDE = 1 << 14  # the middle layer's kernel: 16 x WIDE float32 = 1 MiB
TRANSPORT = ("SHM_ALLREDUCE", "CMA_ALLREDUCE", "MPI_ALLREDUCE")


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
    h = keras.layers.Dense(WIDE, activation="relu", name="middle")(h)
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
    with open(rank_file(os.environ["HVDLIKE_TIMELINE"], r)) as f:
        events = json.load(f)
    rows = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    step_spans = [e for e in events if e["name"] == "STEP"]
    assert len(step_spans) == steps, [e["name"] for e in events][:50]
    for step in step_spans[1:]:  # the first one also traced the function
        begin, end = step["ts"], step["ts"] + step["dur"]
        inside = [e for e in events if e.get("ph") == "X" and begin <= e["ts"] <= end]
        submitted = {rows[e["tid"]]: e["ts"] for e in inside if e["name"] == "QUEUED"}
        moved = {rows[e["tid"]]: e["ts"] + e["dur"] for e in inside if e["name"] in TRANSPORT}
        # every gradient counted in its bucket (shown on each member's row), the small ones
        # that cross packed too
        buckets = {(e["args"]["round"], e["args"]["bucket"]): e["args"]["tensors"]
                   for e in inside if e["name"] in TRANSPORT}
        assert sum(buckets.values()) == 6, buckets
        if OVERLAP and EACH_ALONE:
            # one request per gradient, named after its variable; the last layer's went (and
            # was all-reduced) during the slow stretch, before the first layer's was submitted
            assert sorted(submitted) == sorted(
                f"gradient/{layer}/{w}" for layer in ("first", "middle", "last")
                for w in ("kernel", "bias")), submitted
            first = submitted["gradient/first/kernel"]
            assert first - submitted["gradient/last/kernel"] > 0.75 * SLOW * 1e6, submitted
            assert moved["gradient/last/kernel"] < first, (submitted, moved)
        elif OVERLAP:
            # two buckets, named after their first variable (last layer first): the last
            # and middle layers' four gradients (closed by the 1 MiB kernel) went during the
            # slow stretch, the first layer's two after it
            late, early = "gradient/first/bias+1", "gradient/last/bias+3"
            assert sorted(submitted) == [late, early], submitted
            assert submitted[late] - submitted[early] > 0.75 * SLOW * 1e6, submitted
            assert moved[early] < submitted[late], (submitted, moved)
        else:
            assert len(submitted) == 1, submitted  # one grouped request after backprop
            (only,) = submitted.values()
            assert all(t > only for t in moved.values()), (submitted, moved)

close()
