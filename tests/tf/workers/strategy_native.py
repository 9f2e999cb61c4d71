"""Native tf.distribute.MultiWorkerMirroredStrategy started through hvdlike's TF_CONFIG.

Run under mpirun (np >= 2): export_tf_config() must run before TensorFlow's collective
runtime starts, i.e. before the strategy is created and before any other TF op.
tf_keras (Keras 2) model.fit works with the native strategy; Keras 3 model.fit fails
natively in TF 2.21 / Keras 3.15 (checked here so that the docs stay true).
"""
import json
import os

from common import check, close, assert_close, assert_listens_only_on, hvd, np, tf

r, n = hvd.rank(), hvd.size()
CONFIG = hvd.export_tf_config()  # before the strategy: TF reads TF_CONFIG at creation
strategy = tf.distribute.MultiWorkerMirroredStrategy()

import tf_keras  # noqa: E402  (Keras 2, what the native strategy works with)
import keras  # noqa: E402  (Keras 3)

PER_REPLICA, STEPS = 16, 3
GLOBAL = PER_REPLICA * n
rs = np.random.RandomState(3)
X = rs.rand(STEPS * GLOBAL, 28, 28, 1).astype(np.float32)
Y = rs.randint(0, 10, size=(STEPS * GLOBAL,)).astype(np.int64)


def build(k, seed=100):
    def init(i):
        return dict(kernel_initializer=k.initializers.RandomNormal(0, 0.1, seed=seed + i),
                    bias_initializer=k.initializers.RandomNormal(0, 0.1, seed=seed + 50 + i))
    m = k.Sequential([k.Input((28, 28, 1)), k.layers.Conv2D(4, 3, activation="relu", **init(0)),
                      k.layers.MaxPooling2D(), k.layers.Flatten(), k.layers.Dense(10, **init(1))])
    m.compile(optimizer=k.optimizers.SGD(0.05, momentum=0.9),
              loss=k.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


@check("export_tf_config_starts_native_multiworker_strategy")
def _():
    assert json.loads(os.environ["TF_CONFIG"]) == CONFIG
    assert CONFIG["task"] == {"type": "worker", "index": r}, CONFIG
    assert strategy.num_replicas_in_sync == n, strategy.num_replicas_in_sync
    cr = strategy.cluster_resolver
    assert (cr.task_type, cr.task_id) == ("worker", r)
    assert cr.cluster_spec().as_dict()["worker"] == CONFIG["cluster"]["worker"]


@check("native_strategy_servers_listen_only_on_the_published_address")
def _():
    """hvdlikerun preloads the bind shim: TensorFlow's server (started with the strategy)
    listens on this rank's TF_CONFIG address only, not on every interface."""
    host, port = CONFIG["cluster"]["worker"][r].rsplit(":", 1)
    assert_listens_only_on(host, int(port))


@check("native_strategy_tf_keras_fit_equals_single_process_global_batch")
def _():
    with strategy.scope():
        model = build(tf_keras)
    model.fit(tf.data.Dataset.from_tensor_slices((X, Y)).batch(GLOBAL), epochs=1, verbose=0)
    ref = build(tf_keras)
    ref.fit(X, Y, batch_size=GLOBAL, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), ref.get_weights()):
        assert_close(a, b, rtol=1e-5, atol=1e-6, msg="native MWMS tf_keras fit vs reference")
    gathered = hvd.allgather_object(model.get_weights())
    for other in gathered:
        for a, b in zip(model.get_weights(), other):
            np.testing.assert_array_equal(a, b)


@check("native_strategy_keras3_fit_fails_with_perreplica_error")
def _():
    with strategy.scope():
        model = build(keras)
    try:
        model.fit(tf.data.Dataset.from_tensor_slices((X, Y)).batch(GLOBAL), epochs=1, verbose=0)
    except ValueError as e:
        assert "PerReplica" in str(e), e
    else:  # if this starts passing, update docs/tf_distribute.md and the compare script
        raise AssertionError("native MultiWorkerMirroredStrategy + Keras 3 fit now works")


close()
