"""Native tf_keras ParameterServerStrategy under hvdlikerun, its TF_CONFIG from
``export_tf_config(num_ps=1)`` (run with TF_USE_LEGACY_KERAS=1, np >= 3).

Rank 0 is the chief, rank 1 the ps task, the rest are workers (or the roles that
``NATIVE_PS_ROLES`` lists, passed as ``roles=``: the chief must be rank 0). The ps and worker ranks
serve inside ``export_tf_config`` and leave when the chief's script ends, so only the chief
runs the checks below. ``HVDLIKE_TEST_HOST_ADDRESSES`` (JSON, host name -> IP; the test
cluster's hosts have no name service) gives each rank the address to publish.
"""
import json
import os
import socket

from common import assert_listens_only_on, check, close, hvd, np, tf

ADDRESSES = json.loads(os.environ.get("HVDLIKE_TEST_HOST_ADDRESSES", "{}"))
# NATIVE_PS_ROLES: the roles in rank order (instead of num_ps=1's chief, ps, workers)
ROLES = [r for r in os.environ.get("NATIVE_PS_ROLES", "").split(",") if r] or None
# on ps and worker ranks: serves, then exits 0
CONFIG = hvd.export_tf_config(num_ps=0 if ROLES else 1, roles=ROLES,
                              host=ADDRESSES.get(socket.gethostname()))

import tf_keras as keras  # noqa: E402  (Keras 2: Keras 3 has no parameter-server training)

n = hvd.size()
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)

rs = np.random.RandomState(0)
X = rs.rand(256, 4).astype(np.float32)
Y = (X @ np.array([[1.0], [-2.0], [3.0], [0.5]], np.float32) + 1.0).astype(np.float32)


def dataset_fn(context):
    ds = tf.data.Dataset.from_tensor_slices((X, Y))
    if context is not None:
        ds = ds.shard(context.num_input_pipelines, context.input_pipeline_id)
    return ds.repeat().batch(16)


@check("native_ps_roles_come_from_the_mpi_world")
def _():
    cluster = CONFIG["cluster"]
    print("CLUSTER " + json.dumps(cluster), flush=True)
    assert sorted(cluster) == ["chief", "ps", "worker"], cluster
    assert [len(cluster[k]) for k in ("chief", "ps", "worker")] == [1, 1, n - 2], cluster
    assert CONFIG["task"] == {"type": "chief", "index": 0}, CONFIG
    assert resolver.cluster_spec().as_dict() == cluster


@check("native_ps_servers_listen_only_on_their_published_addresses")
def _():
    """Every server on the chief's host (the chief's own too; on one host, every rank's)
    listens on its TF_CONFIG address only: the sockets of this host are all visible here."""
    own = CONFIG["cluster"]["chief"][0].rsplit(":", 1)[0]
    addresses = [a for addrs in CONFIG["cluster"].values() for a in addrs]
    for address in addresses:
        host, port = address.rsplit(":", 1)
        if host == own:
            assert_listens_only_on(host, int(port))


@check("native_ps_fit_with_a_dataset_function_trains_variables_on_the_ps")
def _():
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(1, input_shape=(4,))])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    assert all("/job:ps" in v.device for v in model.variables), [v.device for v in model.variables]
    before = float(np.mean((model.predict(X, verbose=0) - Y) ** 2))
    model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=3,
              steps_per_epoch=20, verbose=0)
    after = float(np.mean((model.predict(X, verbose=0) - Y) ** 2))
    assert after < 0.2 * before, (before, after)


@check("native_ps_schedule_and_join_run_every_step_on_the_workers")
def _():
    with strategy.scope():
        steps_done = tf.Variable(0, dtype=tf.int64)
        total = tf.Variable(0.0)
    per_worker = coordinator.create_per_worker_dataset(
        strategy.distribute_datasets_from_function(dataset_fn))
    iterator = iter(per_worker)

    @tf.function
    def step(it):
        def replica(x, y):
            steps_done.assign_add(1)
            total.assign_add(tf.reduce_sum(y))
            return tf.reduce_sum(y)
        return strategy.run(replica, args=next(it))

    results = [coordinator.schedule(step, args=(iterator,)) for _ in range(12)]
    coordinator.join()
    assert int(steps_done.numpy()) == 12, steps_done.numpy()
    fetched = sum(float(r.fetch()) for r in results)
    np.testing.assert_allclose(float(total.numpy()), fetched, rtol=1e-5)


close()
print("FINISHED", flush=True)
