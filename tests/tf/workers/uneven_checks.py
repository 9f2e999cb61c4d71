"""Uneven data: ranks that run different numbers of steps.

With ``UnevenDataCallback`` (Keras ``fit``) or ``hvd.join()`` and a broadcast from the rank it
returns (a custom loop) training ends on every rank with the weights of a reference each rank
computes itself: one process applying, step by step, SGD with the sum of the gradients of the
ranks that still had a batch divided by the number of ranks (a rank that has joined adds
zeros). Without them the ranks end in a
``DeadlockError`` that names the step counts. That check runs last: the ranks' engines keep
the requests it leaves behind.
"""
import numpy as np
import keras
import tensorflow as tf

from common import FAILED, assert_close, check, close, hvd, say
import hvdlike.keras as hvd_keras

r, n = hvd.rank(), hvd.size()
LR, BATCH, FEATURES = 0.05, 64, 6


def data(rows_of_rank):
    """Every rank's rows (the same everywhere: seeded), and this rank's."""
    rng = np.random.default_rng(7)
    parts = []
    for q in range(n):
        x = rng.normal(size=(rows_of_rank(q), FEATURES)).astype(np.float32)
        parts.append((x, (x @ np.arange(1, FEATURES + 1, dtype=np.float32))[:, None] / 10))
    return parts


def model():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(1)])


def reference(parts, epochs):
    """The weights after ``epochs`` of the ranks' batches, step k averaging over all ranks the
    gradients of those that have a k-th batch."""
    m = model()
    loss = keras.losses.MeanSquaredError()
    steps = [-(-len(x) // BATCH) for x, _ in parts]
    for _ in range(epochs):
        for k in range(max(steps)):
            total = None
            for x, y in parts:
                if k * BATCH >= len(x):
                    continue  # this rank has run out: it adds zeros
                with tf.GradientTape() as tape:
                    value = loss(y[k * BATCH:(k + 1) * BATCH],
                                 m(x[k * BATCH:(k + 1) * BATCH]))
                grads = tape.gradient(value, m.trainable_variables)
                total = grads if total is None else [a + b for a, b in zip(total, grads)]
            for v, g in zip(m.trainable_variables, total):
                v.assign_sub(LR * g / n)
    return [v.numpy() for v in m.trainable_variables]


def assert_same_on_every_rank(weights):
    for w in weights:
        gathered = hvd.allgather(tf.constant(w[None]))
        for q in range(n):
            assert_close(gathered[q], w, rtol=0, msg=f"rank {q} differs")


def fit(rows_of_rank, epochs=2):
    parts = data(rows_of_rank)
    x, y = parts[r]
    m = model()
    m.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse")
    history = m.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0,
                    callbacks=[hvd_keras.callbacks.MetricAverageCallback(),
                               hvd_keras.callbacks.UnevenDataCallback(),
                               hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)])
    got = [v.numpy() for v in m.trainable_variables]
    assert_same_on_every_rank(got)
    for w, want in zip(got, reference(parts, epochs)):
        assert_close(w, want, rtol=2e-5, atol=2e-6)
    # the epoch's averaged loss reached every rank (MetricAverageCallback after the join)
    losses = hvd.allgather(tf.constant([history.history["loss"][-1]]))
    assert_close(losses, np.full(n, losses[0]), rtol=0)


@check("fit_with_uneven_data_callback_one_row_more_on_rank_0")
def _():
    # 8,193 rows sharded by hand: rank 0 has one more, so one more step when 8,193 / n rows
    # end on a batch boundary (np=2: 65 against 64 steps; np=4: 33 against 32)
    fit(lambda q: len(range(q, 8193, n)))


@check("fit_with_uneven_data_callback_many_steps_apart")
def _():
    fit(lambda q: BATCH * (2 + 3 * q) + 5 * q)


@check("custom_loop_join_after_rank_dependent_steps")
def _():
    parts = data(lambda q: BATCH * (3 + q))
    x, y = parts[r]
    m = model()
    hvd.broadcast_variables(m.variables, root_rank=0)
    loss = keras.losses.MeanSquaredError()

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            value = loss(yb, m(xb))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(value, m.trainable_variables)
        for v, g in zip(m.trainable_variables, grads):
            v.assign_sub(LR * g)

    for k in range(0, len(x), BATCH):
        step(x[k:k + BATCH], y[k:k + BATCH])
    last = int(hvd.join())
    assert last == n - 1, last  # the rank with the most steps joins last
    hvd.broadcast_variables(m.variables, root_rank=last)  # it applied every update
    got = [v.numpy() for v in m.trainable_variables]
    assert_same_on_every_rank(got)
    for w, want in zip(got, reference(parts, 1)):
        assert_close(w, want, rtol=2e-5, atol=2e-6)


@check("without_the_callback_the_deadlock_error_names_the_step_counts")
def _():
    x, y = data(lambda q: BATCH * 3 + (1 if q < max(1, n // 2) else 0))[r]
    m = model()
    m.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse")
    try:
        m.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd_keras.callbacks.MetricAverageCallback()])
    except tf.errors.OpError as e:  # the step's wait op
        message = str(e)
    except hvd.DeadlockError as e:  # MetricAverageCallback's all-reduce
        message = str(e)
    else:
        raise AssertionError("no error")
    say(f"DEADLOCK rank={r} {message.splitlines()[0][:200]}")
    assert "DeadlockError" in message or "deadlock" in message, message
    assert "the ranks ran different numbers of steps" in message, message
    longer = [q for q in range(n) if q < max(1, n // 2)]
    for q in longer:
        assert f"rank {q} waits for its 4th grouped_allreduce 'gradient/" in message, message
    shorter = [q for q in range(n) if q not in longer]
    who = f"rank {shorter[0]}" if len(shorter) == 1 else f"ranks {shorter}"
    assert f"which {who} made 3 times and went on" in message, message
    assert "UnevenDataCallback" in message and "drop_remainder" in message, message


close()
print(f"UNEVEN_DONE rank={r} failed={FAILED}", flush=True)
