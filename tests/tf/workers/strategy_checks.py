"""MPIStrategy checks: the tf.distribute adapter under Keras 3 (or tf_keras) and custom loops.

Every rank also trains the single-process reference (no strategy, global batch) on the
same data and compares to rtol 1e-5.  Run with any number of ranks (1 without mpirun, 2).
"""
import json
import os

from common import check, close, assert_close, hvd, np, shared_temp_dir, tf

from hvdlike.tensorflow import compat

keras = compat.keras()
r, n = hvd.rank(), hvd.size()
RTOL, ATOL = 1e-5, 1e-6
# Adam divides each step by the root of the gradient's second moment, so where a gradient is
# near zero the last-bit difference between the mean of two half-batch means and one
# full-batch mean grows: 2.5e-6 on one weight of 43,264 after an epoch on some CPUs
ADAM_ATOL = 1e-5
STEPS = 3
strategy = hvd.MPIStrategy()

# MNIST-shaped synthetic data; the same global data set on every rank (the strategy shards).
PER_REPLICA = 64
GLOBAL = PER_REPLICA * n
rs = np.random.RandomState(7)
X = rs.rand(STEPS * GLOBAL, 28, 28, 1).astype(np.float32)
Y = rs.randint(0, 10, size=(STEPS * GLOBAL,)).astype(np.int64)


def same_on_every_rank(arrays, what):
    gathered = hvd.allgather_object([np.asarray(a) for a in arrays])
    for k, other in enumerate(gathered):
        for a, b in zip(arrays, other):
            np.testing.assert_array_equal(np.asarray(a), b, err_msg=f"{what}: rank {k} differs")


def build_and_compile(seed, opt="sgd"):
    """The seeds' MultiWorkerMirroredStrategy Keras example model (a small CNN)."""
    def init(i):  # seeded initializers: the initial values differ per seed, not per run
        return dict(kernel_initializer=keras.initializers.RandomNormal(0, 0.1, seed=seed + i),
                    bias_initializer=keras.initializers.RandomNormal(0, 0.1, seed=seed + 50 + i))
    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(8, 3, activation="relu", **init(0)),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(32, activation="relu", **init(1)),
        keras.layers.Dense(10, **init(2)),
    ])
    optimizer = (keras.optimizers.SGD(0.05, momentum=0.9) if opt == "sgd"
                 else keras.optimizers.Adam(0.01))
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def global_dataset():
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(GLOBAL)


def reference(opt):
    ref = build_and_compile(seed=100, opt=opt)  # rank 0's initial weights
    ref.fit(X, Y, batch_size=GLOBAL, epochs=1, shuffle=False, verbose=0)
    return ref


_refs = {}


def ref_model(opt):
    if opt not in _refs:
        _refs[opt] = reference(opt)
    return _refs[opt]


@check("strategy_is_multiworker_with_global_replicas_and_cluster_resolver")
def _():
    assert isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    assert isinstance(strategy, tf.distribute.Strategy)
    assert strategy.num_replicas_in_sync == n, strategy.num_replicas_in_sync
    cr = strategy.cluster_resolver
    assert (cr.task_type, cr.task_id) == ("worker", r), (cr.task_type, cr.task_id)
    assert len(cr.cluster_spec().as_dict()["worker"]) == n
    assert strategy.extended.should_checkpoint == (r == 0)
    assert strategy.extended.should_save_summary == (r == 0)

    @tf.function
    def ids():
        ctx = tf.distribute.get_replica_context()
        return ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync
    rid, num = strategy.experimental_local_results(strategy.run(ids))[0]
    assert (int(rid), int(num)) == (r, n), (int(rid), int(num))


@check("keras_fit_cnn_equals_single_process_global_batch_sgd")
def _():
    with strategy.scope():
        model = build_and_compile(seed=100 + r)  # different start per rank: rank 0's wins
    calls_before = strategy.extended._cross_device_ops._calls
    model.fit(global_dataset(), epochs=1, verbose=0)
    if n > 1:  # the gradient all-reduce went through hvdlike's MPICrossDeviceOps
        assert strategy.extended._cross_device_ops._calls > calls_before
    ref = ref_model("sgd")
    for a, b in zip(model.get_weights(), ref.get_weights()):
        assert_close(a, b, rtol=RTOL, atol=ATOL, msg="fit vs single process")
    same_on_every_rank(model.get_weights(), "weights after fit")


@check("keras_fit_cnn_equals_single_process_global_batch_adam")
def _():
    with strategy.scope():
        model = build_and_compile(seed=100 + r, opt="adam")
    model.fit(global_dataset(), epochs=1, verbose=0)
    ref = ref_model("adam")
    for a, b in zip(model.get_weights(), ref.get_weights()):
        assert_close(a, b, rtol=RTOL, atol=ADAM_ATOL, msg="fit (Adam) vs single process")
    same_on_every_rank(model.get_weights(), "weights after fit (Adam)")


@check("evaluate_and_predict_cover_the_global_data_on_every_rank")
def _():
    with strategy.scope():
        model = build_and_compile(seed=100 + r)
    ref = build_and_compile(seed=100)
    got = model.evaluate(global_dataset(), verbose=0)
    want = ref.evaluate(X, Y, batch_size=GLOBAL, verbose=0)
    assert_close(got, want, rtol=RTOL, atol=ATOL, msg="evaluate: loss/accuracy")
    k = 5 * n + 1  # not a multiple of the number of replicas
    pred = model.predict(X[:k], batch_size=GLOBAL, verbose=0)
    assert pred.shape == (k, 10), pred.shape
    assert_close(pred, ref.predict(X[:k], verbose=0), rtol=RTOL, atol=ATOL, msg="predict")


@check("fit_history_logs_are_global_and_identical_on_every_rank")
def _():
    with strategy.scope():
        model = build_and_compile(seed=100 + r)
    hist = model.fit(global_dataset(), epochs=1, verbose=0).history
    same_on_every_rank([hist["loss"][0], hist["accuracy"][0]], "history")
    ref = build_and_compile(seed=100)
    want = ref.fit(X, Y, batch_size=GLOBAL, epochs=1, shuffle=False, verbose=0).history
    assert_close(hist["loss"][0], want["loss"][0], rtol=RTOL, msg="epoch loss")
    assert_close(hist["accuracy"][0], want["accuracy"][0], rtol=RTOL, msg="epoch accuracy")


@check("custom_loop_run_and_reduce_matches_single_process_on_every_rank")
def _():
    loss_obj = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="none" if compat.is_keras3() else
        keras.losses.Reduction.NONE)
    with strategy.scope():
        model = build_and_compile(seed=100 + r)
        opt = keras.optimizers.SGD(0.05, momentum=0.9)
    dist = strategy.experimental_distribute_dataset(global_dataset())

    @tf.function
    def train_step(batch):
        def step_fn(x, y):
            with tf.GradientTape() as tape:
                per_example = loss_obj(y, model(x, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        per_replica = strategy.run(step_fn, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    losses = [float(train_step(b)) for b in dist]
    assert len(losses) == STEPS, losses
    same_on_every_rank(model.get_weights() + [np.array(losses)], "custom loop weights/loss")

    ref = build_and_compile(seed=100)
    ref_opt = keras.optimizers.SGD(0.05, momentum=0.9)
    ref_losses = []
    for s in range(STEPS):
        x, y = X[s * GLOBAL:(s + 1) * GLOBAL], Y[s * GLOBAL:(s + 1) * GLOBAL]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_obj(y, ref(x, training=True)))
        grads = tape.gradient(loss, ref.trainable_variables)
        ref_opt.apply_gradients(zip(grads, ref.trainable_variables))
        ref_losses.append(float(loss))
    assert_close(losses, ref_losses, rtol=RTOL, msg="global loss per step")
    for a, b in zip(model.get_weights(), ref.get_weights()):
        assert_close(a, b, rtol=RTOL, atol=ATOL, msg="custom loop vs single process")


@check("experimental_distribute_dataset_splits_each_global_batch_over_ranks")
def _():
    idx = np.arange(4 * GLOBAL, dtype=np.int64)
    dist = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(idx).batch(GLOBAL))
    local = [strategy.experimental_local_results(b)[0].numpy() for b in dist]
    assert len(local) == 4 and all(len(b) == PER_REPLICA for b in local), [len(b) for b in local]
    everyone = hvd.allgather_object(local)
    for step in range(4):
        union = np.sort(np.concatenate([everyone[k][step] for k in range(n)]))
        np.testing.assert_array_equal(union, idx[step * GLOBAL:(step + 1) * GLOBAL])


@check("distribute_datasets_from_function_gets_rank_input_context")
def _():
    seen = {}

    def dataset_fn(ctx):
        seen.update(pipelines=ctx.num_input_pipelines, pipeline_id=ctx.input_pipeline_id,
                    per_replica=ctx.get_per_replica_batch_size(GLOBAL))
        ds = tf.data.Dataset.range(4 * GLOBAL).shard(ctx.num_input_pipelines,
                                                     ctx.input_pipeline_id)
        return ds.batch(ctx.get_per_replica_batch_size(GLOBAL))

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    batches = [strategy.experimental_local_results(b)[0].numpy() for b in dist]
    assert seen == dict(pipelines=n, pipeline_id=r, per_replica=PER_REPLICA), seen
    everyone = hvd.allgather_object(batches)
    allrows = np.sort(np.concatenate([np.concatenate(b) for b in everyone]))
    np.testing.assert_array_equal(allrows, np.arange(4 * GLOBAL))


@check("strategy_reduce_gather_and_replica_all_reduce_span_all_ranks")
def _():
    def value_fn(ctx):
        return tf.constant([float(ctx.replica_id_in_sync_group + 1), 1.0])
    v = strategy.experimental_distribute_values_from_function(value_fn)
    total = sum(range(1, n + 1))
    assert_close(strategy.reduce("SUM", v, axis=None), [total, n])
    assert_close(strategy.reduce("MEAN", v, axis=None), [total / n, 1.0])
    assert_close(strategy.reduce("SUM", v, axis=0), total + n)
    assert_close(strategy.reduce("MEAN", v, axis=0), (total + n) / (2 * n))
    gathered = strategy.gather(v, axis=0)
    assert_close(gathered, np.concatenate([[k + 1.0, 1.0] for k in range(n)]))

    @tf.function
    def in_replica():
        ctx = tf.distribute.get_replica_context()
        x = tf.cast(ctx.replica_id_in_sync_group, tf.float32) + 1.0
        i = tf.cast(ctx.replica_id_in_sync_group, tf.int32) + 1
        return (ctx.all_reduce("SUM", [x, x * 2.0]), ctx.all_reduce("MEAN", x),
                ctx.all_reduce("SUM", i))
    (s1, s2), m, si = strategy.experimental_local_results(strategy.run(in_replica))[0]
    assert_close([s1, s2, m], [total, 2 * total, total / n])
    assert int(si) == total and si.dtype == tf.int32, si
    # integer MEAN truncates toward zero, as the core's Average: (-2n - 1) / n -> -2, not -3
    iv = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(-3 if ctx.replica_id_in_sync_group == 0 else -2, tf.int32))
    assert int(strategy.reduce("MEAN", iv, axis=None)) == int(np.trunc((-2 * n - 1) / n))


@check("chief_only_checkpointing_with_should_checkpoint")
def _():
    with strategy.scope():
        model = build_and_compile(seed=100 + r)
    with shared_temp_dir() as base:
        ckpt = tf.train.Checkpoint(model=model)
        written = None
        if strategy.extended.should_checkpoint:
            written = ckpt.write(os.path.join(base, "ckpt"))
        flags = hvd.allgather_object(written is not None)
        assert flags == [k == 0 for k in range(n)], flags
        hvd.barrier()
        with strategy.scope():
            restored = build_and_compile(seed=999)
        tf.train.Checkpoint(model=restored).read(os.path.join(base, "ckpt")).expect_partial()
    for a, b in zip(restored.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


@check("tf_config_lists_every_rank_once_with_distinct_ports")
def _():
    cfg = hvd.tf_config()
    assert cfg["task"] == {"type": "worker", "index": r}, cfg
    workers = cfg["cluster"]["worker"]
    assert len(workers) == n and len(set(workers)) == n, workers
    same_on_every_rank([json.dumps(cfg["cluster"], sort_keys=True)], "cluster")
    if n >= 3:
        roled = hvd.tf_config(chief=True, evaluator=True)
        want = ("chief", 0) if r == 0 else (("evaluator", 0) if r == n - 1 else ("worker", r - 1))
        assert (roled["task"]["type"], roled["task"]["index"]) == want, roled
    elif n == 2:
        roled = hvd.tf_config(chief=True)
        assert roled["task"] == ({"type": "chief", "index": 0} if r == 0
                                 else {"type": "worker", "index": 0}), roled
        assert sorted(roled["cluster"]) == ["chief", "worker"], roled
    try:
        hvd.tf_config(roles=["worker"] * (n + 1))
        raise AssertionError("a wrong number of roles was accepted")
    except ValueError as e:
        assert "one role per rank" in str(e), e
    for bad, says in ((dict(roles=["ps"] + ["worker"] * (n - 1)), "needs one chief"),
                      (dict(num_ps=n), f"num_ps={n} needs"),
                      (dict(num_ps=1, chief=True), "give num_ps or roles")):
        try:
            hvd.export_tf_config(overwrite=True, **bad)
            raise AssertionError(f"export_tf_config({bad}) was accepted")
        except ValueError as e:
            assert says in str(e), e
    old = os.environ.pop("TF_CONFIG", None)
    try:
        exported = hvd.export_tf_config()
        assert json.loads(os.environ["TF_CONFIG"]) == exported
    finally:
        os.environ.pop("TF_CONFIG", None)
        if old is not None:
            os.environ["TF_CONFIG"] = old


close()
