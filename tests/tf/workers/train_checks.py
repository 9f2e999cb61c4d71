"""Training checks: DistributedOptimizer / DistributedGradientTape / callbacks.

Every rank also trains a single-process reference (plain optimizer, global batch
b * size) on the same data and compares.  Run with any number of ranks (1, 2, 4).
"""
import os
import sys
from pathlib import Path

from common import check, close, assert_close, hvd, np, shared_temp_dir, tf

from hvdlike.tensorflow import compat
import hvdlike.keras as hvdk

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the NumPy references
import reference  # noqa: E402

keras = compat.keras()
r, n = hvd.rank(), hvd.size()
B, STEPS, DIM = 4, 3, 8  # per-rank batch, steps per run, features
RTOL, ATOL = 1e-5, 1e-6

rs = np.random.RandomState(123)
X = rs.normal(size=(2 * STEPS * B * n, DIM)).astype(np.float32)
Y = (X @ rs.normal(size=(DIM, 1)) + 0.1).astype(np.float32)


def make_model(seed=0):
    m = keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(16, activation="tanh"),
                          keras.layers.Dense(1)])
    w = np.random.RandomState(seed)
    m.set_weights([w.normal(0, 0.5, v.shape).astype(np.float32) for v in m.get_weights()])
    return m


def local_rows(steps, b, x=X):
    """This rank's part of each global batch of ``b * n`` rows, in step order."""
    return np.concatenate([x[s * b * n + r * b: s * b * n + (r + 1) * b] for s in range(steps)])


OPTS = {"sgd": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
        "adam": lambda: keras.optimizers.Adam(0.01)}
REFERENCE_OPTS = {**OPTS, "plain_sgd": lambda: keras.optimizers.SGD(0.05)}
_references = {}


def reference_weights(opt, steps, global_batch):
    """The weights of the single-process reference (``REFERENCE_OPTS[opt]``, global batch)
    after ``steps`` steps; fitted once per argument triple (several checks compare with the
    same reference)."""
    key = (opt, steps, global_batch)
    if key not in _references:
        m = make_model()
        m.compile(optimizer=REFERENCE_OPTS[opt](), loss="mse")
        m.fit(X[:steps * global_batch], Y[:steps * global_batch], batch_size=global_batch,
              epochs=1, shuffle=False, verbose=0)
        _references[key] = m.get_weights()
    return _references[key]


def same_on_every_rank(arrays, what):
    gathered = hvd.allgather_object([np.asarray(a) for a in arrays])
    for k, other in enumerate(gathered):
        for a, b in zip(arrays, other):
            np.testing.assert_array_equal(np.asarray(a), b, err_msg=f"{what}: rank {k} differs")


def fit_distributed(opt, steps=STEPS, b=B, **compile_kw):
    m = make_model()
    m.compile(optimizer=opt, loss="mse", **compile_kw)
    m.fit(local_rows(steps, b), local_rows(steps, b, Y), batch_size=b, epochs=1,
          shuffle=False, verbose=0)
    return m


for name, make_opt in OPTS.items():
    @check(f"fit_{name}_np_equals_single_process_global_batch")
    def _():
        m = fit_distributed(hvdk.DistributedOptimizer(make_opt()))
        for a, b in zip(m.get_weights(), reference_weights(name, STEPS, B * n)):
            assert_close(a, b, rtol=RTOL, atol=ATOL)
        same_on_every_rank(m.get_weights(), "weights")
        assert int(m.optimizer.iterations.numpy()) == STEPS

    @check(f"custom_loop_{name}_tape_equals_single_process_global_batch")
    def _():
        m, opt = make_model(), make_opt()

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(m(x, training=True) - y))
            tape = hvd.DistributedGradientTape(tape)
            grads = tape.gradient(loss, m.trainable_variables)
            opt.apply_gradients(zip(grads, m.trainable_variables))
            return loss

        xs, ys = local_rows(STEPS, B), local_rows(STEPS, B, Y)
        for s in range(STEPS):
            step(xs[s * B:(s + 1) * B], ys[s * B:(s + 1) * B])
        for a, b in zip(m.get_weights(), reference_weights(name, STEPS, B * n)):
            assert_close(a, b, rtol=RTOL, atol=ATOL)
        same_on_every_rank(m.get_weights(), "weights")


@check("optimizer_options_and_steps_per_execution_equals_single_process_global_batch")
def _():
    """Keras's own optimizer options see the averaged gradients, and several steps per
    compiled call pair up across ranks: global_clipnorm (small enough to clip), EMA, and in
    Keras 3 gradient_accumulation_steps; compile(steps_per_execution=3)."""
    steps = 2 * STEPS  # every row of X
    options = dict(global_clipnorm=0.5, use_ema=True, ema_overwrite_frequency=2)
    if not compat.use_legacy_keras():
        options["gradient_accumulation_steps"] = 2

    def make_opt():
        return keras.optimizers.SGD(0.05, momentum=0.9, **options)

    ref = make_model()
    ref.compile(optimizer=make_opt(), loss="mse", steps_per_execution=3)
    ref.fit(X, Y, batch_size=B * n, epochs=1, shuffle=False, verbose=0)
    m = fit_distributed(hvdk.DistributedOptimizer(make_opt()), steps=steps,
                        steps_per_execution=3)
    for a, b in zip(m.get_weights(), ref.get_weights()):
        assert_close(a, b, rtol=RTOL, atol=ATOL)
    assert not np.allclose(m.get_weights()[0], make_model().get_weights()[0])  # it trained
    same_on_every_rank(m.get_weights(), "weights")


if compat.use_legacy_keras():
    @check("tf_keras_computed_gradients_come_back_reduced_and_are_applied_once")
    def _():
        """As in Horovod, the gradients a tf_keras DistributedOptimizer computes itself
        (_compute_gradients; compute_gradients in minimize; get_gradients of optimizers.legacy) come
        back reduced, and applying them (even changed) does not reduce them again; plain
        tape gradients are still reduced in apply_gradients.  op=Sum makes a second reduction
        show (n times the step)."""
        lr = 0.1
        x, y = local_rows(1, B), local_rows(1, B, Y)

        def loss_of(m):
            return lambda: tf.reduce_mean(tf.square(m(x) - y))

        m0 = make_model()
        with tf.GradientTape() as tape:
            loss = loss_of(m0)()
        local = [g.numpy() for g in tape.gradient(loss, m0.trainable_variables)]
        w0 = [v.numpy() for v in m0.trainable_variables]
        per_rank = hvd.allgather_object(local)
        for op in (hvd.Average, hvd.Sum):
            expected = [sum(g[i] for g in per_rank) / (n if op == hvd.Average else 1)
                        for i in range(len(local))]

            def after_one_step(g):
                return [w - lr * e * g for w, e in zip(w0, expected)]

            def weights(m):
                return [v.numpy() for v in m.trainable_variables]

            for kind, opt_class in (("new", keras.optimizers.SGD),
                                    ("legacy", keras.optimizers.legacy.SGD)):
                what = f"{kind} {op}"
                # computed by the optimizer, halved, then applied: reduced once
                m = make_model()
                opt = hvdk.DistributedOptimizer(opt_class(lr), op=op)
                gv = opt._compute_gradients(loss_of(m), m.trainable_variables)
                for (g, _), e in zip(gv, expected):
                    assert_close(g.numpy(), e, rtol=RTOL, atol=ATOL, msg=what)
                opt.apply_gradients([(0.5 * g, v) for g, v in gv])
                for a, b in zip(weights(m), after_one_step(0.5)):
                    assert_close(a, b, rtol=RTOL, atol=ATOL, msg=what)
                # minimize in a tf.function
                m = make_model()
                opt = hvdk.DistributedOptimizer(opt_class(lr), op=op)
                m(x)

                @tf.function
                def minimize():
                    opt.minimize(loss_of(m), m.trainable_variables)

                minimize()
                for a, b in zip(weights(m), after_one_step(1.0)):
                    assert_close(a, b, rtol=RTOL, atol=ATOL, msg=what + " minimize")
                # tape gradients are reduced by apply_gradients
                opt = hvdk.DistributedOptimizer(opt_class(lr), op=op)
                m = make_model()
                opt.apply_gradients(zip([tf.constant(g) for g in local], m.trainable_variables))
                for a, b in zip(weights(m), after_one_step(1.0)):
                    assert_close(a, b, rtol=RTOL, atol=ATOL, msg=what + " tape")
            # legacy get_gradients (graph only: inside a tf.function)
            m = make_model()
            opt = hvdk.DistributedOptimizer(keras.optimizers.legacy.SGD(lr), op=op)
            m(x)
            got = tf.function(lambda: opt.get_gradients(loss_of(m)(), m.trainable_variables))()
            for g, e in zip(got, expected):
                assert_close(g.numpy(), e, rtol=RTOL, atol=ATOL, msg=f"get_gradients {op}")


if compat.use_legacy_keras():
    @check("tf_keras_backward_passes_as_horovods_agg_helper_and_iterations")
    def _():
        """backward_passes_per_step=3 driven as Horovod's tests drive it (_compute_gradients
        then apply_gradients in a tf.function): the reduced sum of 3 passes (divided by 3 with
        average_aggregated_gradients) is applied every 3rd pass, a local variable's gradient
        is this rank's divided by n, iterations counts every pass, _agg_helper.counter the
        passes since the last update; a non-finite pass does not outlive its update."""
        c = float(r + 1)
        mean_c = (n + 1) / 2.0
        for kind, opt_class in (("new", keras.optimizers.SGD),
                                ("legacy", keras.optimizers.legacy.SGD)):
            assert hvdk.DistributedOptimizer(opt_class(1.0))._agg_helper is None, kind
            for average in (False, True):
                what = f"{kind} average_aggregated_gradients={average}"
                v, w = tf.Variable([1.0, 2.0]), tf.Variable(3.0)
                opt = hvdk.DistributedOptimizer(opt_class(1.0), backward_passes_per_step=3,
                                                average_aggregated_gradients=average)
                opt.register_local_var(w)
                _ = opt.iterations

                @tf.function
                def step():
                    gv = opt._compute_gradients(
                        lambda: c * (v[0] + 2.0 * v[1]) + c * w, [v, w])
                    opt.apply_gradients(gv)

                per_update = 3.0 / (3.0 if average else 1.0)
                for p in range(7):
                    step()
                    updates = (p + 1) // 3
                    assert_close(v.numpy(), [1.0 - updates * per_update * mean_c,
                                             2.0 - updates * per_update * 2.0 * mean_c],
                                 msg=f"{what} pass {p}")
                    assert_close(w.numpy(), 3.0 - updates * per_update * c / n,
                                 msg=f"{what} local, pass {p}")
                    assert int(opt.iterations.numpy()) == p + 1, (what, opt.iterations)
                assert int(opt._agg_helper.counter.numpy()) == 7 % 3, what
            if kind == "new":
                try:
                    opt._compute_gradients(lambda: v[0], [v], grad_loss=tf.constant(1.0))
                except ValueError as e:
                    assert "grad_loss is not supported" in str(e), e
                else:
                    raise AssertionError("grad_loss must be refused")
        # an infinite first pass: its update is applied, then the sums restart from zero
        x = tf.Variable(0.0)
        opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.0), backward_passes_per_step=2,
                                        sparse_as_dense=True)
        for p in range(4):
            gv = opt._compute_gradients(lambda: x * (float("inf") if p == 0 else 1.0), [x])
            opt.apply_gradients(gv)
        assert np.isfinite(gv[0][0].numpy())
        assert [float(a.numpy()) for a in opt._agg_helper.accumulators] == [0.0]
        assert int(opt.iterations.numpy()) == 4


@check("tape_as_context_manager_eager_nested_sources")
def _():
    v1, v2 = tf.Variable([1.0, 2.0]), tf.Variable(3.0)
    with hvd.DistributedGradientTape(tf.GradientTape()) as tape:
        loss = tf.reduce_sum(v1 * (r + 1)) + v2 * (r + 1)
    g = tape.gradient(loss, {"a": v1, "b": [v2]})
    mean = np.mean(np.arange(n) + 1)
    assert_close(g["a"], [mean, mean])
    assert_close(g["b"][0], mean)
    with tf.GradientTape() as t2:
        loss = tf.reduce_sum(v1) * (r + 1)
    gs = hvd.DistributedGradientTape(t2, op=hvd.Sum).gradient(loss, [v1, v2])
    assert gs[1] is None  # unconnected stays None on every rank
    assert_close(gs[0], [np.sum(np.arange(n) + 1)] * 2)


@check("gradients_none_on_some_ranks_only_raise_with_a_hint_on_every_rank")
def _():
    if n == 1:
        return
    v1, v2 = tf.Variable([1.0, 2.0]), tf.Variable(3.0)
    with tf.GradientTape() as tape:  # v2 is in rank 0's loss only
        loss = tf.reduce_sum(v1) + (v2 if r == 0 else 0.0)
    try:
        hvd.DistributedGradientTape(tape).gradient(loss, [v1, v2])
    except tf.errors.FailedPreconditionError as e:
        assert "None on some ranks only" in str(e), e
    else:
        raise AssertionError("no error")
    hvd.barrier()


@check("backward_passes_per_step_2_equals_one_step_with_doubled_batch")
def _():
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                    backward_passes_per_step=2,
                                    average_aggregated_gradients=True)
    m = make_model()
    m.compile(optimizer=opt, loss="mse")
    # update u uses global rows [2uBn, 2(u+1)Bn); micro-step j of rank r gets one block
    xs = np.concatenate([X[(2 * u + j) * B * n + r * B:(2 * u + j) * B * n + (r + 1) * B]
                         for u in range(STEPS) for j in range(2)])
    ys = np.concatenate([Y[(2 * u + j) * B * n + r * B:(2 * u + j) * B * n + (r + 1) * B]
                         for u in range(STEPS) for j in range(2)])
    m.fit(xs, ys, batch_size=B, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(m.get_weights(), reference_weights("sgd", STEPS, 2 * B * n)):
        assert_close(a, b, rtol=RTOL, atol=ATOL)
    # Keras 3 counts updates; tf_keras counts every pass, as Horovod's tf_keras optimizer
    passes = 2 if compat.use_legacy_keras() else 1
    assert int(m.optimizer.iterations.numpy()) == STEPS * passes


@check("op_sum_predivide_and_num_groups_variants")
def _():
    ref = reference_weights("plain_sgd", STEPS, B * n)
    for kw in (dict(gradient_predivide_factor=2.0), dict(num_groups=2),
               dict(groups=[[]]), dict(sparse_as_dense=True)):
        m = fit_distributed(hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05), **kw))
        for a, b in zip(m.get_weights(), ref):
            assert_close(a, b, rtol=RTOL, atol=ATOL, msg=str(kw))
    # op=Sum with lr/n is the same update as Average with lr
    m = fit_distributed(hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05 / n), op=hvd.Sum))
    for a, b in zip(m.get_weights(), ref):
        assert_close(a, b, rtol=1e-4, atol=1e-6)


@check("compression_fp16_and_bf16_stay_within_tolerance")
def _():
    ref = reference_weights("plain_sgd", STEPS, B * n)
    for comp, tol in ((hvd.Compression.fp16, 2e-3), (hvd.Compression.bf16, 2e-2)):
        m = fit_distributed(hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05),
                                                      compression=comp))
        for a, b in zip(m.get_weights(), ref):
            assert_close(a, b, rtol=tol, atol=tol)
        same_on_every_rank(m.get_weights(), "weights")


class Recorder(keras.callbacks.Callback):
    """Records model+optimizer variables before every batch and after the last one."""

    def __init__(self):
        super().__init__()
        self.snapshots = []

    def _snap(self):
        opt_vars = self.model.optimizer.variables
        self.snapshots.append([v.numpy() for v in list(self.model.variables) + list(opt_vars)])

    def on_train_batch_begin(self, batch, logs=None):
        self._snap()

    def on_train_end(self, logs=None):
        self._snap()


@check("broadcast_callback_keeps_weights_and_slots_identical_every_step")
def _():
    m = make_model(seed=100 + r)  # deliberately different initial weights per rank
    m.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    rec = Recorder()
    m.fit(local_rows(STEPS, B), local_rows(STEPS, B, Y), batch_size=B, epochs=2,
          shuffle=False, verbose=0,
          callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0), rec])
    assert len(rec.snapshots) == 2 * STEPS + 1
    for snap in rec.snapshots:
        same_on_every_rank(snap, "model+optimizer variables")
    # a single-process run starting from rank 0's weights gives the same result
    ref = make_model(seed=100)
    ref.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    gx = np.concatenate([X[:STEPS * B * n]] * 2)
    gy = np.concatenate([Y[:STEPS * B * n]] * 2)
    ref.fit(gx, gy, batch_size=B * n, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(m.get_weights(), ref.get_weights()):
        assert_close(a, b, rtol=RTOL, atol=ATOL)


class RecorderOnceBuilt(Recorder):
    """A Recorder that starts once the model is built (tf_keras builds it in the first batch;
    Keras 3 before it)."""

    def on_train_batch_begin(self, batch, logs=None):
        if self.model.built:
            self._snap()


@check("broadcast_callback_on_a_model_built_by_its_first_batch")
def _():
    # no input shape: fit builds the model with the first batch, as in Horovod's
    # tensorflow2_keras_mnist.py; the callback then broadcasts right after that batch
    keras.utils.set_random_seed(100 + r)  # deliberately different initial weights per rank
    m = keras.Sequential([keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)])
    assert not m.built
    m.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
              loss="mse")
    rec = RecorderOnceBuilt()
    m.fit(local_rows(STEPS, B), local_rows(STEPS, B, Y), batch_size=B, epochs=1,
          shuffle=False, verbose=0,
          callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0), rec])
    assert len(rec.snapshots) >= STEPS  # from the second batch on at least
    for snap in rec.snapshots:
        same_on_every_rank(snap, "model+optimizer variables")
    same_on_every_rank(m.get_weights(), "weights after fit")


@check("metric_average_callback_averages_epoch_logs")
def _():
    class Raw(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.raw = dict(logs)

    raw = Raw()
    m = make_model()
    m.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse",
              metrics=["mae"])
    h = m.fit(local_rows(STEPS, B), local_rows(STEPS, B, Y), batch_size=B, epochs=1,
              shuffle=False, verbose=0,
              validation_data=(local_rows(1, B), local_rows(1, B, Y)),
              callbacks=[raw, hvdk.callbacks.MetricAverageCallback()])
    raws = hvd.allgather_object(raw.raw)
    for key in ("loss", "mae", "val_loss", "val_mae"):
        expect = np.mean([d[key] for d in raws])
        assert_close(h.history[key][0], expect, rtol=1e-6)
    same_on_every_rank([h.history["loss"][0]], "averaged loss")


@check("learning_rate_warmup_and_schedule_callbacks")
def _():
    lrs = []

    class LR(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            lrs.append(float(np.asarray(self.model.optimizer.learning_rate)))

    m = make_model()
    m.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    m.fit(local_rows(STEPS, B), local_rows(STEPS, B, Y), batch_size=B, epochs=3,
          shuffle=False, verbose=0,
          callbacks=[hvdk.callbacks.LearningRateWarmupCallback(initial_lr=0.1,
                                                               warmup_epochs=2),
                     hvdk.callbacks.LearningRateScheduleCallback(
                         initial_lr=0.1, multiplier=0.5, start_epoch=2), LR()])
    expect = [0.1 / n * ((e + b / STEPS) * (n - 1) / 2 + 1)
              for e in range(2) for b in range(STEPS)] + [0.05] * STEPS
    assert_close(lrs, expect, rtol=1e-6)


@check("load_model_restores_wrapped_optimizer_with_state")
def _():
    m = fit_distributed(hvdk.DistributedOptimizer(keras.optimizers.Adam(0.01)))
    with shared_temp_dir() as d:
        path = os.path.join(d, "model.keras")
        ck = hvdk.callbacks.ModelCheckpoint(path)
        ck.set_model(m)
        ck.on_epoch_end(0, {"loss": 1.0})  # writes on rank 0 only
        hvd.barrier()
        assert os.path.exists(path)
        loaded = hvdk.load_model(path, legacy_opts=False)  # Horovod's keyword is accepted
        from hvdlike.tensorflow.optimizer import is_distributed_optimizer
        assert is_distributed_optimizer(loaded.optimizer), type(loaded.optimizer).__mro__
        assert isinstance(loaded.optimizer, keras.optimizers.Adam)
        for a, b in zip(loaded.optimizer.variables, m.optimizer.variables):
            assert_close(a, b)
        # training continues identically from the restored state
        loaded.fit(local_rows(STEPS, B), local_rows(STEPS, B, Y), batch_size=B, verbose=0,
                   shuffle=False)
        m.fit(local_rows(STEPS, B), local_rows(STEPS, B, Y), batch_size=B, verbose=0,
              shuffle=False)
        for a, b in zip(loaded.get_weights(), m.get_weights()):
            assert_close(a, b, rtol=RTOL, atol=ATOL)
        plain = keras.models.load_model(path)  # also loadable without hvdlike
        assert not is_distributed_optimizer(plain.optimizer)
        if compat.use_legacy_keras():  # tf_keras's other formats: .h5 and a SavedModel
            for name in ("model.h5", "saved_model"):
                path = os.path.join(d, name)
                if r == 0:
                    m.save(path)
                hvd.barrier()
                loaded = hvdk.load_model(path)
                assert is_distributed_optimizer(loaded.optimizer), (name, type(loaded.optimizer))
                assert isinstance(loaded.optimizer, keras.optimizers.Adam), name


@check("tape_results_given_to_a_distributed_optimizer_warn_once")
def _():
    """A DistributedGradientTape's gradients handed to a DistributedOptimizer are reduced
    twice (with op=Sum: size() times too large): one warning per optimizer, eager and in
    tf.function; a plain optimizer, or a plain tape, gets none."""
    import logging

    class Seen(logging.Handler):
        def __init__(self):
            super().__init__()
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    seen = Seen()
    logging.getLogger("hvdlike").addHandler(seen)

    def step(distributed_tape, distributed_optimizer, compiled):
        w = tf.Variable([1.0, 2.0])
        opt = keras.optimizers.SGD(1.0)
        if distributed_optimizer:
            opt = hvdk.DistributedOptimizer(opt, op=hvd.Sum)

        def apply():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(w) * (r + 1)
            if distributed_tape:
                tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
            opt.apply_gradients(zip(tape.gradient(loss, [w]), [w]))
        for _ in range(2):  # the warning comes once per optimizer
            (tf.function(apply) if compiled else apply)()
        return w.numpy()

    try:
        total = n * (n + 1) / 2  # the Sum of the ranks' gradients (r + 1)
        for compiled in (False, True):
            before = len(seen.messages)
            w = step(True, True, compiled)
            warned = [m for m in seen.messages[before:] if "already reduced" in m]
            assert len(warned) == (1 if n > 1 else 0), (compiled, seen.messages)
            assert_close(w, np.array([1.0, 2.0]) - 2 * total * n, msg=f"twice {compiled}")
            before = len(seen.messages)
            assert_close(step(True, False, compiled), np.array([1.0, 2.0]) - 2 * total, msg="tape")
            assert_close(step(False, True, compiled), np.array([1.0, 2.0]) - 2 * total, msg="opt")
            assert len(seen.messages) == before, seen.messages
    finally:
        logging.getLogger("hvdlike").removeHandler(seen)


@check("bad_inputs_give_clear_errors")
def _():
    class NotKeras:
        pass
    try:
        hvdk.DistributedOptimizer(NotKeras())
    except TypeError as e:
        assert "keras.optimizers" in str(e), e
    else:
        raise AssertionError("non-Keras optimizer accepted")
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1))
    v = tf.Variable([1.0])
    try:
        opt.apply_gradients([(None, v)])
    except ValueError as e:
        assert "None" in str(e), e
    else:
        raise AssertionError("all-None gradients accepted")
    try:
        hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Max)
    except ValueError as e:
        assert "Average" in str(e), e
    else:
        raise AssertionError("op=Max accepted")
    refused = {
        "predivide": (lambda: hvdk.DistributedOptimizer(
            keras.optimizers.SGD(0.1), op=hvd.Adasum, gradient_predivide_factor=2.0),
            ValueError, "only supported with op=Average"),
        "sparse": (lambda: hvd.allreduce(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]),
                                                          tf.constant([3, 2])), op=hvd.Adasum),
                   NotImplementedError, "sparse_as_dense=True"),  # Horovod's class
    }
    for what, (call, error, words) in refused.items():
        try:
            call()
        except error as e:
            assert words in str(e), e
        else:
            raise AssertionError(f"op=Adasum with {what} accepted")


@check("adasum_gradients_match_the_pairwise_tree_in_tape_optimizer_and_allreduce")
def _():
    """op=Adasum: each variable's gradient is combined over the ranks by Horovod's adaptive
    summation (as Horovod's Keras optimizer does), in the tape, in fit and in allreduce."""
    x, y = local_rows(1, B), local_rows(1, B, Y)
    m = make_model()

    def loss_of(model):
        return tf.reduce_mean(tf.square(model(x, training=True) - y))

    with tf.GradientTape() as tape:
        loss = loss_of(m)
    local = [g.numpy() for g in tape.gradient(loss, m.trainable_variables)]
    everyone = hvd.allgather_object(local)
    want = [reference.adasum([grads[i] for grads in everyone]) for i in range(len(local))]
    with tf.GradientTape() as tape:
        loss = loss_of(m)
    got = hvd.DistributedGradientTape(tape, op=hvd.Adasum).gradient(loss,
                                                                    m.trainable_variables)
    for g, w in zip(got, want):
        assert_close(g, w, rtol=RTOL, atol=ATOL)
    assert_close(hvd.allreduce(tf.constant(local[0]), op=hvd.Adasum), want[0], rtol=RTOL,
                 atol=ATOL)
    lr = 0.1
    fitted = fit_distributed(hvdk.DistributedOptimizer(keras.optimizers.SGD(lr),
                                                       op=hvd.Adasum), steps=1)
    for w, w0, g in zip(fitted.get_weights(), make_model().get_weights(), want):
        assert_close(w, w0 - lr * g, rtol=RTOL, atol=ATOL)
    same_on_every_rank(fitted.get_weights(), "weights")


@check("embedding_indexed_slices_gradients_match_reference")
def _():
    ids = np.random.RandomState(5).randint(0, 20, size=(STEPS * B * n, 3))

    def emb_model():
        m = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(20, 4),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
        w = np.random.RandomState(1)
        m.set_weights([w.normal(0, 0.5, v.shape).astype(np.float32) for v in m.get_weights()])
        return m

    ref = emb_model()
    ref.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    ref.fit(ids, Y[:len(ids)], batch_size=B * n, shuffle=False, verbose=0)
    # gradient_predivide_factor scales the sparse gradients' values (Horovod refuses it)
    for kw in ({}, {"sparse_as_dense": True}, {"gradient_predivide_factor": 2.0}):
        m = emb_model()
        m.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1), **kw),
                  loss="mse")
        m.fit(local_rows(STEPS, B, ids), local_rows(STEPS, B, Y), batch_size=B,
              shuffle=False, verbose=0)
        for a, b in zip(m.get_weights(), ref.get_weights()):
            assert_close(a, b, rtol=RTOL, atol=ATOL, msg=str(kw))


@check("mixed_precision_loss_scale_inside_outside_and_compile_wrapped")
def _():
    """Keras 3 and tf_keras: a LossScaleOptimizer inside or outside DistributedOptimizer, or
    added by compile, trains as one process does, and an overflow on one rank only makes
    every rank skip the step (Keras 3: the ranks agree on the finite check; tf_keras: the
    check sees the gradients compute_gradients reduced)."""
    mp = keras.mixed_precision
    LSO = mp.LossScaleOptimizer
    set_policy = getattr(mp, "set_dtype_policy", None) or mp.set_global_policy  # tf_keras

    def scale(opt):  # Keras 3: dynamic_scale; tf_keras: loss_scale
        return opt.dynamic_scale if hasattr(opt, "dynamic_scale") else opt.loss_scale

    from hvdlike.tensorflow.optimizer import is_distributed_optimizer
    try:
        set_policy("mixed_float16")
        # fixed small scale (no overflow): LossScaleOptimizer inside or outside equals the
        # single-process reference within fp16 tolerance
        ref = make_model()
        ref.compile(optimizer=LSO(keras.optimizers.SGD(0.05), initial_scale=128.0), loss="mse")
        ref.fit(X[:STEPS * B * n], Y[:STEPS * B * n], batch_size=B * n, shuffle=False,
                verbose=0)
        variants = {
            "inside": lambda: hvdk.DistributedOptimizer(
                LSO(keras.optimizers.SGD(0.05), initial_scale=128.0)),
            "outside": lambda: LSO(hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05)),
                                   initial_scale=128.0),
        }
        for label, make_opt in variants.items():
            m = fit_distributed(make_opt())
            assert isinstance(m.optimizer, LSO), label
            for a, b in zip(m.get_weights(), ref.get_weights()):
                assert_close(a, b, rtol=1e-2, atol=2e-3, msg=label)
            same_on_every_rank(m.get_weights(), f"weights ({label})")
        # a plain DistributedOptimizer under the policy: model.compile wraps it in a
        # LossScaleOptimizer (outside, dynamic scale)
        m = fit_distributed(hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05)),
                            steps=2 * STEPS)
        assert isinstance(m.optimizer, LSO) and is_distributed_optimizer(
            m.optimizer.inner_optimizer), type(m.optimizer)
        w = m.get_weights()
        assert all(np.isfinite(a).all() for a in w)
        same_on_every_rank(w + [scale(m.optimizer).numpy()], "weights and loss scale")
        # overflow on the last rank only: every rank skips the step and halves its scale
        m = make_model()
        before = m.get_weights()
        opt = LSO(hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05)), initial_scale=2.0**15)
        m.compile(optimizer=opt, loss="mse")
        x = local_rows(1, B).copy()
        if r == n - 1:
            x *= 1e4  # fp16 gradients of the first layer overflow at this loss scale
        m.fit(x, local_rows(1, B, Y), batch_size=B, epochs=1, shuffle=False, verbose=0)
        assert float(scale(opt).numpy()) == 2.0**14, scale(opt).numpy()
        for a, b in zip(m.get_weights(), before):
            np.testing.assert_array_equal(a, b)
        same_on_every_rank(m.get_weights() + [scale(opt).numpy()], "after overflow")
        # backward_passes_per_step=2, so the checked gradients are each rank's own: the
        # overflowing first pass is skipped on every rank, the next two make one update, as
        # training on those two passes alone at the halved scale does
        def accumulating(initial_scale):
            return LSO(hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05),
                                                 backward_passes_per_step=2),
                       initial_scale=initial_scale)

        x, y = local_rows(3, B).copy(), local_rows(3, B, Y)
        if r == n - 1:
            x[:B] *= 1e5  # beyond float16: an inf input
        m, ref = make_model(), make_model()
        m.compile(optimizer=accumulating(2.0**10), loss="mse")
        m.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
        ref.compile(optimizer=accumulating(2.0**9), loss="mse")
        ref.fit(x[B:], y[B:], batch_size=B, epochs=1, shuffle=False, verbose=0)
        assert float(scale(m.optimizer).numpy()) == 2.0**9, scale(m.optimizer).numpy()
        assert not np.array_equal(m.get_weights()[0], before[0])  # the update was applied
        for a, b in zip(m.get_weights(), ref.get_weights()):
            assert_close(a, b, rtol=1e-3, atol=1e-5, msg="backward_passes_per_step=2")
        same_on_every_rank(m.get_weights() + [scale(m.optimizer).numpy()],
                           "after overflow, backward_passes_per_step=2")
    finally:
        set_policy("float32")


if not compat.use_legacy_keras():  # (tf_keras: XLA-compiled steps are refused, clearly)
    @check("xla_fit_matches_one_process_on_the_global_batch")
    def _():
        """compile(jit_compile=True) with a DistributedOptimizer, alone (Adam), inside a
        LossScaleOptimizer and with backward_passes_per_step=2 (SGD with momentum): the
        weights equal one process on the global batch, and XLA compiled both the model's
        computation and the wrapped optimizer's update (each records whether it was traced
        in an XLA context). A custom loop as the docs show it equals the same reference."""
        traced = []

        class Probe(keras.layers.Layer):
            def call(self, x):
                traced.append(("layer", compat.in_xla_context()))
                return x

        def probed(make_opt):
            cls = type(make_opt())

            class Probed(cls):
                def update_step(self, *args, **kwargs):
                    traced.append(("update", compat.in_xla_context()))
                    return super().update_step(*args, **kwargs)
            return Probed.from_config(make_opt().get_config())

        LSO = keras.mixed_precision.LossScaleOptimizer
        for name, how in (("adam", "alone"), ("sgd", "loss_scale"), ("sgd", "bpps2")):
            make_opt = OPTS[name]
            del traced[:]
            m = keras.Sequential([Probe()] + make_model().layers)
            if how == "bpps2":  # update u: micro-step j of rank r gets one block of B
                opt = hvdk.DistributedOptimizer(probed(make_opt), backward_passes_per_step=2,
                                                average_aggregated_gradients=True)
                xs, ys = (np.concatenate([
                    a[(2 * u + j) * B * n + r * B:(2 * u + j) * B * n + (r + 1) * B]
                    for u in range(STEPS) for j in range(2)]) for a in (X, Y))
            else:
                opt = hvdk.DistributedOptimizer(probed(make_opt))
                opt = LSO(opt) if how == "loss_scale" else opt
                xs, ys = local_rows(STEPS, B), local_rows(STEPS, B, Y)
            m.compile(optimizer=opt, loss="mse", jit_compile=True)
            m.fit(xs, ys, batch_size=B, epochs=1, shuffle=False, verbose=0)
            reference = reference_weights(name, STEPS, (2 if how == "bpps2" else 1) * B * n)
            for a, b in zip(m.get_weights(), reference):
                assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"{name}, {how}")
            same_on_every_rank(m.get_weights(), f"weights ({name}, {how})")
            assert m.jit_compile is True
            assert set(traced) == {("layer", True), ("update", True)}, (name, how, traced)

        # a custom loop as docs/tensorflow.md shows it: the collective between compiled parts
        m, opt = make_model(), OPTS["sgd"]()

        @tf.function(jit_compile=True)
        def gradients(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(m(x, training=True) - y))
            return tape.gradient(loss, m.trainable_variables)

        @tf.function(jit_compile=True)
        def update(grads):
            opt.apply_gradients(zip(grads, m.trainable_variables))

        @tf.function
        def step(x, y):
            update(hvd.grouped_allreduce(gradients(x, y)))

        xs, ys = local_rows(STEPS, B), local_rows(STEPS, B, Y)
        for i in range(STEPS):
            step(xs[i * B:(i + 1) * B], ys[i * B:(i + 1) * B])
        for a, b in zip(m.get_weights(), reference_weights("sgd", STEPS, B * n)):
            assert_close(a, b, rtol=1e-4, atol=1e-5, msg="custom loop")
        same_on_every_rank(m.get_weights(), "weights (custom loop)")

    @check("keras3_optimizers_answer_to_the_tf_keras_names_horovod_examples_use")
    def _():
        """``opt.variables()`` (Horovod's custom-loop example broadcasts it) and ``opt.lr``
        with ``tf.keras.backend.set_value`` / ``get_value`` (its elastic Keras example resets
        the learning rate so): tf_keras names Keras 3 dropped, which hvdlike puts back."""
        LSO, SGD = keras.mixed_precision.LossScaleOptimizer, keras.optimizers.SGD
        for opt, fit in ((SGD(0.1, momentum=0.9), False),
                         (hvdk.DistributedOptimizer(SGD(0.1, momentum=0.9)), True),
                         (LSO(hvdk.DistributedOptimizer(SGD(0.1, momentum=0.9))), True)):
            kind = type(opt).__name__
            if not fit:
                opt.build(make_model().trainable_variables)
            m = fit_distributed(opt) if fit else None
            variables = opt.variables
            assert isinstance(variables, list) and len(variables) > 0, kind
            assert [id(v) for v in opt.variables()] == [id(v) for v in variables], kind
            assert float(tf.keras.backend.get_value(opt.lr)) == np.float32(0.1), kind
            tf.keras.backend.set_value(opt.lr, 0.25)
            assert float(np.asarray(opt.learning_rate)) == 0.25, kind
            opt.lr = 0.5
            assert float(np.asarray(opt.learning_rate)) == 0.5, kind
            if m is not None:
                same_on_every_rank(m.get_weights(), f"weights, {kind}")


@check("shard_dataset_data_and_file_policies")
def _():
    ds = tf.data.Dataset.range(10 * n)
    got = [int(v) for v in hvd.shard_dataset(ds, policy="DATA")]
    assert got == list(range(r, 10 * n, n)), got
    everyone = hvd.allgather_object(got)
    assert sorted(sum(everyone, [])) == list(range(10 * n))
    files = tf.data.Dataset.from_tensor_slices([f"f{i}.tfrecord" for i in range(2 * n)])
    mine = [v.decode() for v in hvd.shard_dataset(files, policy="FILE").as_numpy_iterator()]
    assert mine == [f"f{i}.tfrecord" for i in range(r, 2 * n, n)], mine
    try:
        hvd.shard_dataset(ds, policy="FILE")
    except ValueError as e:
        assert "file names" in str(e), e
    else:
        raise AssertionError("FILE policy accepted a non-file dataset")



@check("sync_batch_norm_equals_one_process_on_the_global_batch")
def _():
    """hvd.SyncBatchNormalization on each rank's rows (ranks have different batch sizes) gives
    what one BatchNormalization gives on all rows together: outputs, moving statistics, and
    the gradients of the summed loss; Horovod's name, in either Keras flavour."""
    rows = [3 + q for q in range(n)]  # uneven batches
    start = sum(rows[:r])
    full = np.random.RandomState(7).normal(2.0, 3.0, (sum(rows), 5)).astype(np.float32)
    mine = full[start:start + rows[r]]
    sync = hvd.SyncBatchNormalization(momentum=0.5)
    plain = keras.layers.BatchNormalization(momentum=0.5)
    x, xf = tf.constant(mine), tf.constant(full)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = sync(x, training=True)
        loss = tf.reduce_sum(y * tf.range(1.0, 6.0))
    with tf.GradientTape() as ref_tape:
        ref_tape.watch(xf)
        yf = plain(xf, training=True)
        ref_loss = tf.reduce_sum(yf * tf.range(1.0, 6.0))
    assert_close(y, yf.numpy()[start:start + rows[r]], rtol=1e-4, atol=1e-5)
    assert_close(sync.moving_mean, plain.moving_mean, rtol=1e-5, atol=1e-6)
    assert_close(sync.moving_variance, plain.moving_variance, rtol=1e-4, atol=1e-6)
    # the loss of the whole job is the sum of every rank's loss: its gradient for this rank's
    # rows equals the single process's gradient of the loss on every row
    assert_close(tape.gradient(loss, x), ref_tape.gradient(ref_loss, xf).numpy()[start:start
                 + rows[r]], rtol=1e-3, atol=1e-4)
    assert_close(sync(x, training=False), plain(tf.constant(mine), training=False), rtol=1e-5)
    # Horovod's signature: its scripts pass fused=False (Keras 3's layer has no such argument)
    horovod_style = hvd.SyncBatchNormalization(momentum=0.5, fused=False)
    assert_close(horovod_style(x, training=True), y, rtol=1e-5, atol=1e-6)

@check("process_set_gradients_are_averaged_in_the_set_and_others_keep_their_own")
def _():
    """Horovod's test_distributed_gradient_tape_process_sets: the even ranks' set averages
    its members' gradients; a rank outside the set keeps its own (Horovod's rule)."""
    evens = list(range(0, n, 2))
    ps = hvd.global_process_set if n == 1 else hvd.add_process_set(evens)
    mine = float(r + 1)
    want = np.mean([k + 1.0 for k in evens]) if r in evens else mine
    w = tf.Variable([1.0, 2.0])

    def tape_gradient():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * mine)
        return hvd.DistributedGradientTape(tape, process_set=ps).gradient(loss, [w])[0]
    for fn in (tape_gradient, tf.function(tape_gradient)):
        assert_close(fn(), [want, want])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), process_set=ps)
    opt.apply_gradients([(tf.constant([mine, mine]), w)])
    assert_close(w, [1.0 - want, 2.0 - want])
    if ps is not hvd.global_process_set:
        hvd.remove_process_set(ps)


close()
