"""tf_keras ``model.fit`` in a TF1 graph (eager execution disabled, as Horovod's Keras examples
ran): Keras builds the step with ``optimizer.get_updates``, whose ``get_gradients`` a
DistributedOptimizer reduces.  Every rank must end where one process training on the global
batch ends.  Run with TF_USE_LEGACY_KERAS=1."""
import tensorflow as tf

tf.compat.v1.disable_eager_execution()

from common import assert_close, check, close, hvd, np  # noqa: E402

from hvdlike.tensorflow import compat  # noqa: E402
import hvdlike.tensorflow.keras as hvdk  # noqa: E402

keras = compat.keras()
r, n = hvd.rank(), hvd.size()
B, STEPS, DIM = 8, 3, 5
rs = np.random.RandomState(0)
X = rs.normal(size=(STEPS * B * n, DIM)).astype(np.float32)
Y = (X @ rs.normal(size=(DIM, 1))).astype(np.float32)


def make_model():
    m = keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(4, activation="tanh"),
                          keras.layers.Dense(1)])
    w = np.random.RandomState(1)
    m.set_weights([w.normal(0, 0.5, v.shape).astype(np.float32) for v in m.get_weights()])
    return m


@check("v1_graph_fit_with_legacy_optimizer_equals_single_process_global_batch")
def _():
    assert compat.use_legacy_keras() and not tf.executing_eagerly()
    for name, make_opt in (("sgd", lambda: keras.optimizers.legacy.SGD(0.1, momentum=0.9)),
                           ("adam", lambda: keras.optimizers.legacy.Adam(0.01))):
        ref = make_model()
        ref.compile(optimizer=make_opt(), loss="mse")
        ref.fit(X, Y, batch_size=B * n, shuffle=False, verbose=0)
        m = make_model()
        m.compile(optimizer=hvdk.DistributedOptimizer(make_opt()), loss="mse")
        rows = np.concatenate([np.arange(s * B * n + r * B, s * B * n + (r + 1) * B)
                               for s in range(STEPS)])
        m.fit(X[rows], Y[rows], batch_size=B, shuffle=False, verbose=0)
        assert not np.allclose(m.get_weights()[0], make_model().get_weights()[0])  # trained
        for a, b in zip(m.get_weights(), ref.get_weights()):
            assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


close()
