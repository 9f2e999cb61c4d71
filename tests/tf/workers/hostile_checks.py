"""Hostile input to the TensorFlow API, eager and in ``tf.function``: Hypothesis draws a
collective, a dtype, a shape (0-d and zero-size included), an op, a root and splits (valid,
negative, oversized, of the wrong length), NaN and inf values. Every rank runs the same
derandomized search in lockstep. Each call must give NumPy's answer or raise the documented
error, and every rank must see the same outcome (gathered and compared each example); a hang
is caught by the job's timeout. Then fixed cases: unpicklable objects, unregistered and
removed process sets.
"""
import sys
from pathlib import Path

from common import check, close, hvd, np, tf  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the NumPy references
import reference  # noqa: E402
import hvdlike  # noqa: E402
from hvdlike.base.dtypes import SUPPORTED  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402
from hypothesis.extra.numpy import array_shapes  # noqa: E402

r, n = hvd.rank(), hvd.size()
SETTINGS = settings(max_examples=int(__import__("os").environ.get("HOSTILE_EXAMPLES", "60")),
                    derandomize=True, database=None, deadline=None)
DTYPES = [d for d in SUPPORTED]
KINDS = ["allreduce", "allgather", "broadcast", "alltoall", "reducescatter"]
OPS = ["Sum", "Average", "Min", "Max"]
seen = {"ok": 0, "error": 0}


def refused_on_every_rank(what, make, kinds, text):
    """``make()`` raises one of ``kinds`` whose message holds ``text``, on every rank."""
    try:
        make()
        outcome = "no error"
    except kinds as e:
        outcome = "error" if text in str(e) else str(e)
    assert hvdlike.allgather_object(outcome) == ["error"] * n, (what, outcome)


def make(dtype, shape, seed, rank, special):
    rng = np.random.default_rng([seed, rank])
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if special and (dtype.kind == "f" or str(dtype) == "bfloat16"):
        return np.array([np.nan, np.inf, -np.inf, 1.0, -3.0])[rng.integers(0, 5, shape)].astype(dtype)
    return rng.integers(0 if dtype.kind == "u" else -4, 5, shape).astype(dtype)


def expected(kind, xs, op, root, splits):
    """(result, None) or (None, the documented error text) for this input."""
    x0 = xs[0]
    if kind != "allreduce" and kind != "broadcast" and x0.ndim == 0:
        return None, "scalar"
    if kind == "allreduce":
        if x0.dtype == bool and op == "Average":
            return None, "Average is not defined for bool"
        return reference.reduce(xs, op), None
    if kind == "allgather":
        return np.concatenate(xs), None
    if kind == "broadcast":
        if not 0 <= root < n:
            return None, f"root_rank {root} is not a rank"
        return xs[root], None
    if kind == "alltoall":
        if splits is None:
            if x0.shape[0] % n:
                return None, "alltoall"
            splits = [[x0.shape[0] // n] * n] * n
        for s, x in zip(splits, xs):
            if len(s) != n or min(s) < 0 or sum(s) != x.shape[0]:
                return None, "alltoall splits must be"
        return reference.alltoall(xs, splits, r), None
    if x0.dtype == bool and op == "Average":
        return None, "Average is not defined for bool"
    return reference.scatter_block(reference.reduce(xs, op), r, n), None


def call(kind, x, op, root, splits, compiled):
    def fn(t):
        if kind == "allreduce":
            return hvd.allreduce(t, op=getattr(hvd, op))
        if kind == "allgather":
            return hvd.allgather(t)
        if kind == "broadcast":
            return hvd.broadcast(t, root_rank=root)
        if kind == "alltoall":
            return hvd.alltoall(t, splits=splits)[0] if splits is not None else hvd.alltoall(t)
        return hvd.reducescatter(t, op=getattr(hvd, op))
    t = tf.constant(x)
    return (tf.function(fn, jit_compile=False) if compiled else fn)(t).numpy()


SPLITS = st.sampled_from(["none", "valid", "negative", "oversized", "short"])


@SETTINGS
@given(kind=st.sampled_from(KINDS), dtype=st.sampled_from([str(d) for d in DTYPES]),
       shape=array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
       op=st.sampled_from(OPS), root=st.sampled_from([0, n - 1, -1, n, n + 5]),
       splits=SPLITS, special=st.booleans(), compiled=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def hostile_call(kind, dtype, shape, op, root, splits, special, compiled, seed):
    dt = next(d for d in DTYPES if str(d) == dtype)
    xs = [make(dt, shape, seed, k, special) for k in range(n)]
    split_of = None
    if kind == "alltoall" and splits != "none" and xs[0].ndim > 0:
        rows = xs[0].shape[0]
        base = [rows // n] * n
        base[-1] += rows - sum(base)
        split_of = {"valid": base, "negative": [-1] + base[1:-1] + [base[-1] + 1] if n > 1
                    else [-1], "oversized": [rows + 1] * n, "short": base[:-1]}[splits]
    want, error = expected(kind, xs, op, root, None if split_of is None
                           else [split_of] * n)
    try:
        got = call(kind, xs[r], op, root, split_of, compiled)
        outcome = "ok" if error is None and got.dtype == want.dtype and got.shape == want.shape \
            and np.array_equal(got.astype(np.float64), want.astype(np.float64),
                               equal_nan=True) else f"wrong: {got!r} want {want!r} ({error})"
    except (ValueError, TypeError, tf.errors.OpError) as e:
        outcome = "error" if error is not None and error in str(e) else \
            f"unexpected {type(e).__name__}: {str(e)[:300]} (wanted {error!r})"
    everyone = hvdlike.allgather_object(outcome)
    assert len(set(everyone)) == 1, f"ranks disagree: {everyone}"
    assert outcome in ("ok", "error"), (kind, dtype, shape, op, root, split_of, compiled,
                                        outcome)
    seen[outcome] += 1


@check("hostile_tensorflow_calls_give_numpy_or_the_documented_error_on_every_rank")
def _():
    hostile_call()
    assert seen["ok"] >= 10 and seen["error"] >= 5, seen


def _by_hand(process_set_id):
    """Horovod's test_horovod_allreduce_process_set_id_error: an id no rank registered."""
    ps = hvd.ProcessSet([0])
    ps.process_set_id = process_set_id
    return ps


def _tape_gradient(process_set):
    w = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * w) * (r + 1)
    return hvd.DistributedGradientTape(tape, process_set=process_set).gradient(loss, [w])


def _optimizer_step(process_set):
    w = tf.Variable([1.0, 2.0])
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), process_set=process_set)
    opt.apply_gradients([(tf.ones([2]) * (r + 1), w)])


@check("unpicklable_object_and_bad_process_sets_raise_on_every_rank")
def _():
    for what, fn, text in [
        ("unpicklable", lambda: hvd.broadcast_object(lambda: None, root_rank=0),
         "cannot be pickled"),
        ("unregistered", lambda: hvd.allreduce(tf.ones([2]), process_set=hvd.ProcessSet([0])),
         "is not registered"),
        ("id set by hand", lambda: hvd.allreduce(tf.ones([2]), process_set=_by_hand(10)),
         "is not registered"),
        # the gradients' reduction, too: before, they stayed local with no error
        ("tape, unregistered", lambda: _tape_gradient(hvd.ProcessSet(range(n))),
         "is not registered"),
        ("optimizer, unregistered", lambda: _optimizer_step(hvd.ProcessSet(range(n))),
         "is not registered"),
        # raised in a Keras layer's call: Keras re-creates the error with its context
        ("sync batch norm, unregistered", lambda: hvd.SyncBatchNormalization(
            process_set=hvd.ProcessSet(range(n)))(tf.ones([4, 3]), training=True),
         "is not registered"),
        ("sync batch norm, fused", lambda: hvd.SyncBatchNormalization(fused=True),
         "fused=True is not supported"),
    ]:
        refused_on_every_rank(what, fn, (ValueError, TypeError), text)
    if n > 1:  # different models on the ranks: the error names the fused broadcast
        refused_on_every_rank(
            "models differ",
            lambda: hvd.broadcast_variables([tf.Variable(tf.zeros([2 + r]))], root_rank=0),
            tf.errors.FailedPreconditionError,
            "'broadcast_variables/float32': ranks called it with different")
    ps = hvd.add_process_set([0])
    hvd.remove_process_set(ps)
    for compiled in (False, True):
        fn = lambda: hvd.allreduce(tf.ones([2]), process_set=ps)  # noqa: E731
        refused_on_every_rank("removed", tf.function(fn) if compiled else fn,
                              (ValueError, tf.errors.OpError), "is not registered")
    with tf.Graph().as_default():  # in a graph the op is refused when built, as in Horovod
        try:
            hvd.allreduce(tf.ones([2]), process_set=_by_hand(10))
            outcome = "no error"
        except ValueError as e:
            outcome = "error" if "is not registered" in str(e) else str(e)
    assert hvdlike.allgather_object(outcome) == ["error"] * n, ("graph", outcome)
    if n > 1:  # a rank outside a set: tf.errors.InvalidArgumentError, as in Horovod
        ps = hvd.add_process_set([0])
        outcome = "member" if r == 0 else "no error"
        if r != 0:
            try:
                hvd.allreduce(tf.ones([2]), process_set=ps)
            except tf.errors.InvalidArgumentError as e:
                outcome = "member" if f"rank {r} is not a member" in str(e) else str(e)
        assert hvdlike.allgather_object(outcome) == ["member"] * n, ("outside", outcome)
        outcome = "member" if r == 0 else "no error"
        if r != 0:  # a rank outside the set has no shard of it
            try:
                hvd.shard_dataset(tf.data.Dataset.range(8), process_set=ps)
            except ValueError as e:
                outcome = "member" if f"rank {r} is not a member" in str(e) else str(e)
        assert hvdlike.allgather_object(outcome) == ["member"] * n, ("shard outside", outcome)
        hvd.remove_process_set(ps)


@check("wrong_kinds_of_arguments_say_what_is_expected_on_every_rank")
def _():
    x, sgd = tf.ones([3]), tf.keras.optimizers.SGD
    for what, fn, text in [
        ("process set as ranks", lambda: hvd.allreduce(x, process_set=[0]),
         "process_set= takes a ProcessSet"),
        ("process set as ranks, traced", lambda: tf.function(
            lambda: hvd.allreduce(x, process_set=[0]))(), "process_set= takes a ProcessSet"),
        ("name not a string", lambda: hvd.allreduce(x, name=123), "name= takes a string"),
        ("name not a string, traced", lambda: tf.function(
            lambda: hvd.allgather(x, name=("g", 1)))(), "name= takes a string"),
        ("name not a string, traced broadcast", lambda: tf.function(
            lambda: hvd.broadcast(x, 0, name=7))(), "got int 7"),
        ("name not a string, traced reducescatter", lambda: tf.function(
            lambda: hvd.reducescatter(tf.ones([4]), name=b"r"))(), "got bytes"),
        ("one tensor to a grouped call", lambda: hvd.grouped_allreduce(x),
         "grouped_allreduce() takes a list, got one EagerTensor"),
        ("one tensor to grouped allgather", lambda: hvd.grouped_allgather(x),
         "grouped_allgather() takes a list"),
        ("compression as a string", lambda: hvd.allreduce(x, compression="fp16"),
         "compression= takes hvdlike.tensorflow.Compression.none"),
        ("optimizer, compression", lambda: hvd.DistributedOptimizer(sgd(0.1), compression="fp16"),
         "DistributedOptimizer: compression= takes"),
        ("optimizer, process set", lambda: hvd.DistributedOptimizer(sgd(0.1), process_set=[0]),
         "DistributedOptimizer: process_set= takes a ProcessSet"),
        ("tape, compression", lambda: hvd.DistributedGradientTape(tf.GradientTape(),
                                                                  compression="fp16"),
         "DistributedGradientTape: compression= takes"),
        ("tensors to broadcast_variables", lambda: hvd.broadcast_variables([x], root_rank=0),
         "takes variables (e.g. model.variables), got a EagerTensor at position 0"),
        ("one variable to broadcast_variables",
         lambda: hvd.broadcast_variables(tf.Variable(x), root_rank=0),
         "takes a list of variables, got one ResourceVariable"),
    ]:
        refused_on_every_rank(what, fn, TypeError, text)


@check("callback_arguments_that_cannot_work_are_refused_on_every_rank")
def _():
    import hvdlike.tensorflow.keras as hvdk
    cb = hvdk.callbacks
    for what, make, kind, text in [
        ("negative warmup", lambda: cb.LearningRateWarmupCallback(0.1, warmup_epochs=-1),
         ValueError, "warmup_epochs=-1; pass 0 (no warmup) or more"),
        ("empty schedule", lambda: cb.LearningRateScheduleCallback(0.1, 0.5, start_epoch=5,
                                                                    end_epoch=3),
         ValueError, "end_epoch=3 is before start_epoch=5"),
        ("zero steps", lambda: cb.LearningRateWarmupCallback(0.1, steps_per_epoch=0),
         ValueError, "steps_per_epoch=0; pass at least 1"),
        ("multiplier a string", lambda: cb.LearningRateScheduleCallback(0.1, "0.5"),
         TypeError, "multiplier= takes a number or a function of the epoch, got str"),
    ]:
        refused_on_every_rank(what, make, kind, text)
    # what stays accepted: no warmup, a one-epoch schedule, NumPy and plain numbers
    cb.LearningRateWarmupCallback(0.1, warmup_epochs=0)
    cb.LearningRateScheduleCallback(0.1, np.float32(0.5), start_epoch=2, end_epoch=2)
    cb.LearningRateScheduleCallback(0.1, 1, start_epoch=1, end_epoch=2, steps_per_epoch=1)


@check("keras3_compile_takes_horovods_flag_only_with_a_distributed_optimizer")
def _():
    # Horovod's Keras examples pass compile(experimental_run_tf_function=False); Keras 3
    # refuses the argument, hvdlike drops it for a model whose optimizer is distributed
    import keras
    import hvdlike.tensorflow.keras as hvdk

    def model():
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, "relu", True, "ones")])
    refused_on_every_rank(
        "without a distributed optimizer",
        lambda: model().compile(optimizer=keras.optimizers.SGD(0.1), loss="mse",
                                experimental_run_tf_function=False),
        TypeError, "experimental_run_tf_function")
    x, y = np.full((4, 3), r + 1, np.float32), np.ones((4, 2), np.float32)  # rank's own data
    for how in ("keyword", "positional", "loss-scaled"):
        m = model()
        opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1))
        if how == "loss-scaled":
            opt = keras.optimizers.LossScaleOptimizer(opt)
        if how == "positional":
            m.compile(opt, "mse", experimental_run_tf_function=False)
        else:
            m.compile(optimizer=opt, loss="mse", experimental_run_tf_function=True)
        m.fit(x, y, epochs=1, verbose=0)
        weights = hvdlike.allgather_object([w.tolist() for w in m.get_weights()])
        assert all(w == weights[0] for w in weights), how


close()
