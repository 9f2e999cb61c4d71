"""hvdlike's asynchronous parameter-server training (ParameterServerTraining), at np=3
(1 server + 2 workers) and np=4 (NUM_SERVERS from argv: 1 + 3, or 2 + 2: shards on two
servers). Keras ``fit`` and a custom ``tf.function`` loop; Keras 3 or tf_keras."""
import os
import sys

from common import assert_close, check, close, hvd, np, say, shared_temp_dir, tf  # noqa: F401

from hvdlike.tensorflow import compat

keras = compat.keras()
NUM_SERVERS = int(sys.argv[1]) if len(sys.argv) > 1 else 1
BATCH, STEPS = 8, 6


def model_and_data(seed=3):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="tanh"),
                          keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)])
    return m


def shard(worker):
    rng = np.random.default_rng(100 + worker)
    x = rng.standard_normal((BATCH * STEPS, 6)).astype(np.float32)
    return x, (x @ np.linspace(-1, 1, 6, dtype=np.float32))[:, None]


def reference(workers, optimizer, steps=STEPS):
    """One process, global batch: worker 0's batch k, then worker 1's, ... per step."""
    m = model_and_data()
    m.compile(optimizer=optimizer, loss="mse")
    shards = [shard(w) for w in range(workers)]
    x = np.concatenate([s[0][k * BATCH:(k + 1) * BATCH] for k in range(steps) for s in shards])
    y = np.concatenate([s[1][k * BATCH:(k + 1) * BATCH] for k in range(steps) for s in shards])
    m.fit(x, y, batch_size=BATCH * workers, epochs=1, shuffle=False, verbose=0)
    return m.get_weights()


def trained(max_staleness, optimizer, total_steps=None, compression=hvd.Compression.none,
            slow=0.0, checkpoint_dir=None, seed=3):
    m = model_and_data(seed)
    ps = hvd.ParameterServerTraining(m, optimizer, num_servers=NUM_SERVERS,
                                     max_staleness=max_staleness, total_steps=total_steps,
                                     compression=compression, checkpoint_dir=checkpoint_dir)
    m.compile(optimizer=ps.optimizer, loss="mse")

    def train():
        x, y = shard(ps.worker_index)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
        if slow and ps.worker_index == ps.num_workers - 1:
            from tensorflow.python.data.experimental.ops import testing
            ds = ds.apply(testing.sleep(int(slow * 1e6)))  # in TF's threads, not Python's
        steps = STEPS if total_steps is None else 10 * STEPS
        return m.fit(ds.repeat(), steps_per_epoch=steps, epochs=1, verbose=0,
                     callbacks=[ps.callback()])

    ps.run(train)
    return m, ps


def same_on_every_rank(weights):
    for w in weights:
        for other in hvd.allgather_object(w):
            np.testing.assert_array_equal(other, w)


@check("ps_staleness_0_equals_one_process_with_the_global_batch")
def _():
    m, ps = trained(0, keras.optimizers.Adam(0.01))
    want = reference(ps.num_workers, keras.optimizers.Adam(0.01))
    for got, ref in zip(m.get_weights(), want):
        assert_close(got, ref, rtol=1e-5, atol=1e-6)
    assert ps.stats["updates"] == STEPS and ps.stats["mean_staleness"] == 0, ps.stats


@check("ps_async_applies_total_steps_and_every_rank_ends_with_the_servers_weights")
def _():
    m, ps = trained(None, keras.optimizers.SGD(0.05), total_steps=5 * STEPS)
    same_on_every_rank(m.get_weights())
    assert ps.stats["updates"] == 5 * STEPS, ps.stats
    assert sum(ps.stats["pushes"].values()) == 5 * STEPS + ps.stats["discarded"], ps.stats
    assert ps.stats["discarded"] <= ps.num_workers - 1, ps.stats
    x, y = shard(0)
    loss0 = float(np.mean((model_and_data().predict(x, verbose=0) - y) ** 2))
    loss1 = float(np.mean((m.predict(x, verbose=0) - y) ** 2))
    assert loss1 < loss0, (loss0, loss1)


@check("ps_async_push_is_one_step_of_the_optimizer_whatever_the_optimizer")
def _():
    # only worker 0 trains, so its pushes apply in order: each is one step of the server's
    # optimizer, as in one process with the same learning rate
    for make in (lambda lr: keras.optimizers.Adam(lr),
                 lambda lr: keras.optimizers.SGD(lr, momentum=0.9)):
        m = model_and_data()
        ps = hvd.ParameterServerTraining(m, make(0.01), num_servers=NUM_SERVERS)
        m.compile(optimizer=ps.optimizer, loss="mse")
        x, y = shard(0)
        ps.run(lambda: m.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
               if ps.worker_index == 0 else None)
        want = reference(1, make(0.01))
        for got, ref in zip(m.get_weights(), want):
            assert_close(got, ref, rtol=1e-5, atol=1e-6)
        assert ps.stats["updates"] == STEPS, ps.stats


class OneThreadInMpi:
    """Stands in for a ParameterServerTraining's communicator: every call (and every call on
    the requests it returns) goes to the real one, and the most threads inside such calls at
    once is kept."""

    def __init__(self, comm):
        import threading
        self._comm, self._lock, self.inside, self.most = comm, threading.Lock(), 0, 0

    def _wrap(self, fn):
        def call(*args, **kwargs):
            with self._lock:
                self.inside += 1
                self.most = max(self.most, self.inside)
            try:
                out = fn(*args, **kwargs)
            finally:
                with self._lock:
                    self.inside -= 1
            return OneThreadInMpi(out) if type(out).__name__ == "Request" else out
        return call

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        return self._wrap(attr) if callable(attr) else attr


@check("ps_async_learns_as_one_process_taking_the_same_steps_with_one_thread_in_mpi")
def _():
    # each worker's pushes are steps on its own shard; one process taking the same number of
    # steps, the workers' batches in turn, sets the loss to reach (on all the workers' data)
    from hvdlike import runtime
    total = 8 * STEPS * (hvd.size() - NUM_SERVERS)
    m = model_and_data()
    ps = hvd.ParameterServerTraining(m, keras.optimizers.Adam(0.01), num_servers=NUM_SERVERS,
                                     total_steps=total)
    m.compile(optimizer=ps.optimizer, loss="mse")
    watch = ps._comm = OneThreadInMpi(ps._comm)
    if ps._server is not None:  # a server's loop sends and receives on it too
        ps._server.comm = watch
    engine = runtime.state().engine
    rounds = []

    def train():
        rounds.append(engine._round_no)
        x, y = shard(ps.worker_index)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()
        out = m.fit(ds, steps_per_epoch=10 * total, epochs=1, verbose=0,
                    callbacks=[ps.callback()])
        rounds.append(engine._round_no)
        return out

    ps.run(train)
    assert watch.most == 1, f"{watch.most} threads of rank {hvd.rank()} in MPI at once"
    assert rounds == [] or rounds[0] == rounds[1], f"the engine ran rounds in train: {rounds}"
    assert ps.stats["updates"] == total, ps.stats
    data = [shard(w) for w in range(ps.num_workers)]
    x = np.concatenate([d[0] for d in data])
    y = np.concatenate([d[1] for d in data])
    one = model_and_data()
    one.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    turns = [(d[0][k * BATCH:(k + 1) * BATCH], d[1][k * BATCH:(k + 1) * BATCH])
             for k in range(STEPS) for d in data]
    for step in range(total):
        one.train_on_batch(*turns[step % len(turns)])
    start = float(np.mean((model_and_data().predict(x, verbose=0) - y) ** 2))
    want = float(np.mean((one.predict(x, verbose=0) - y) ** 2))
    got = float(np.mean((m.predict(x, verbose=0) - y) ** 2))
    say(f"PS_LOSS rank={hvd.rank()} start={start:.5f} one_process={want:.5f} async={got:.5f} "
        f"staleness={ps.stats['mean_staleness']:.2f}")
    assert got <= 1.05 * want, (start, want, got, ps.stats)


@check("ps_lookahead_sends_a_stale_worker_the_weights_moved_on_by_the_last_update")
def _():
    # worker 0 pushes first, then worker 1 pushes a gradient computed on the initial weights:
    # one update stale, so its reply is the weights moved on once more by that last update
    # (with lookahead; without, the weights themselves). Checked against one process.
    from mpi4py import MPI
    for lookahead in (True, False):
        m = model_and_data()
        grads = []
        for w in range(2):
            xw, yw = shard(w)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((m(xw[:BATCH]) - yw[:BATCH]) ** 2)
            grads.append([g.numpy() for g in tape.gradient(loss, m.trainable_variables)])
        ps = hvd.ParameterServerTraining(m, keras.optimizers.Adam(0.01), num_servers=NUM_SERVERS,
                                         lookahead=lookahead)
        order = MPI.COMM_WORLD.Dup()
        got = []

        def train():
            if ps.worker_index == 0:
                got.append(ps.push_and_pull(grads[0]))
                if ps.num_workers > 1:
                    order.send(True, dest=1)
            elif ps.worker_index == 1:
                order.recv(source=0)
                got.append(ps.push_and_pull(grads[1]))

        ps.run(train)
        order.Free()
        replies = hvd.allgather_object(got[0] if got else None)
        if ps.num_workers < 2:
            continue
        one = model_and_data()
        opt = keras.optimizers.Adam(0.01)
        opt.apply_gradients(zip([tf.constant(g) for g in grads[0]], one.trainable_variables))
        w1 = [v.numpy() for v in one.trainable_variables]
        opt.apply_gradients(zip([tf.constant(g) for g in grads[1]], one.trainable_variables))
        w2 = [v.numpy() for v in one.trainable_variables]
        want = [b + (b - a) for a, b in zip(w1, w2)] if lookahead else w2
        for got0, got1, a, b in zip(replies[0], replies[1], w1, want):
            assert_close(got0, a, rtol=1e-5, atol=1e-7)
            assert_close(got1, b, rtol=1e-5, atol=1e-7)
        assert ps.stats["mean_staleness"] == 0.5, ps.stats  # 0, then 1
        assert not any(np.allclose(a, b) for a, b in zip(w1, w2))  # the second update moved


@check("ps_staleness_bound_holds_with_a_slow_worker")
def _():
    m, ps = trained(1, keras.optimizers.SGD(0.05), total_steps=6 * STEPS, slow=0.02)
    assert ps.stats["max_lead"] <= 1, ps.stats
    # unbounded: the fast workers did more of the steps. The slow worker waits 0.2 s a step,
    # so a fast worker that starts training up to a few seconds after it (2 cores, 3-4
    # ranks) still does most of them (at 0.02 s it once pushed 14 times to the slow one's 23)
    m, ps = trained(None, keras.optimizers.SGD(0.05), total_steps=6 * STEPS, slow=0.2)
    if ps.num_workers > 1:
        pushes = ps.stats["pushes"]
        assert pushes[0] > pushes[ps.num_workers - 1], ps.stats


@check("ps_a_fit_step_pulls_the_weights_once_its_batch_is_there")
def _():
    # the last worker's input pipeline waits 0.2 s before each batch: its step's pull must
    # come after that wait (else the other workers' pushes during it make its gradients
    # stale). Each batch counts itself once produced; each pull notes the count it sees.
    from tensorflow.python.data.experimental.ops import testing
    m = model_and_data()
    ps = hvd.ParameterServerTraining(m, keras.optimizers.SGD(0.05), num_servers=NUM_SERVERS)
    m.compile(optimizer=ps.optimizer, loss="mse")
    produced, seen = [0], []
    pull = ps.pull

    def counted_pull():
        seen.append(produced[0])
        return pull()

    def count(x, y):
        def bump(x):
            produced[0] += 1
            return x
        out = tf.py_function(bump, [x], tf.float32)
        out.set_shape(x.shape)
        return out, y

    def train():
        # static shapes (as Keras's own pipelines often have): the batch's size is a constant
        ds = tf.data.Dataset.from_tensor_slices(shard(ps.worker_index)).batch(
            BATCH, drop_remainder=True)
        if ps.worker_index == ps.num_workers - 1:
            ds = ds.apply(testing.sleep(200_000)).map(count)
        m.fit(ds, steps_per_epoch=STEPS, epochs=1, verbose=0)

    ps.pull = counted_pull
    ps.run(train)
    if ps.worker_index == ps.num_workers - 1:
        assert len(seen) == STEPS, seen
        assert all(n >= k + 1 for k, n in enumerate(seen)), f"batches there at each pull: {seen}"


@check("ps_custom_loop_staleness_0_equals_one_process")
def _():
    m = model_and_data()
    ps = hvd.ParameterServerTraining(m, keras.optimizers.SGD(0.1, momentum=0.9),
                                     num_servers=NUM_SERVERS, max_staleness=0)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((m(x) - y) ** 2)
        grads = tape.gradient(loss, m.trainable_variables)
        ps.optimizer.apply_gradients(zip(grads, m.trainable_variables))

    def train():
        x, y = shard(ps.worker_index)
        for k in range(STEPS):
            step(x[k * BATCH:(k + 1) * BATCH], y[k * BATCH:(k + 1) * BATCH])

    ps.run(train)
    want = reference(ps.num_workers, keras.optimizers.SGD(0.1, momentum=0.9))
    for got, ref in zip(m.get_weights(), want):
        assert_close(got, ref, rtol=1e-5, atol=1e-6)


@check("ps_fp16_compressed_pushes_stay_close_to_uncompressed")
def _():
    plain, _ = trained(0, keras.optimizers.SGD(0.1))
    packed, _ = trained(0, keras.optimizers.SGD(0.1), compression=hvd.Compression.fp16)
    for a, b in zip(plain.get_weights(), packed.get_weights()):
        assert_close(a, b, rtol=0, atol=2e-3)


@check("ps_checkpoints_from_the_servers_resume_without_more_updates")
def _():
    with shared_temp_dir() as folder:
        first, _ = trained(0, keras.optimizers.Adam(0.01),
                           total_steps=STEPS * (hvd.size() - NUM_SERVERS), checkpoint_dir=folder)
        again, ps = trained(0, keras.optimizers.Adam(0.01),
                            total_steps=STEPS * (hvd.size() - NUM_SERVERS),
                            checkpoint_dir=folder, seed=99)  # other initial weights: replaced
    for a, b in zip(first.get_weights(), again.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert ps.stats["updates"] == STEPS, ps.stats  # loaded, and nothing more applied


@check("ps_workers_start_from_the_weights_the_servers_loaded")
def _():
    """A custom loop's first gradients come from the workers' own weights, before any pull."""
    with shared_temp_dir() as folder:
        first, _ = trained(0, keras.optimizers.Adam(0.01),
                           total_steps=STEPS * (hvd.size() - NUM_SERVERS), checkpoint_dir=folder)
        resumed = model_and_data(seed=99)  # other initial weights
        hvd.ParameterServerTraining(resumed, keras.optimizers.Adam(0.01),
                                    num_servers=NUM_SERVERS, checkpoint_dir=folder)
    for a, b in zip(first.get_weights(), resumed.get_weights()):
        np.testing.assert_array_equal(a, b)


@check("ps_bad_arguments_raise_on_every_rank")
def _():
    for kwargs, text in [({"num_servers": hvd.size()}, "num_servers must lie in"),
                         ({"max_staleness": -1}, "max_staleness must be None or >= 0")]:
        try:
            hvd.ParameterServerTraining(model_and_data(), keras.optimizers.SGD(0.1), **kwargs)
        except ValueError as e:
            assert text in str(e), e
        else:
            raise AssertionError("no error")


def raised(call):
    try:
        call()
    except Exception as e:  # noqa: BLE001 (the check looks at what each rank raised)
        return e
    raise AssertionError(f"rank {hvd.rank()}: no error")


@check("ps_an_error_in_train_or_on_a_server_ends_run_with_an_error_on_every_rank")
def _():
    """Worker 1's train raising: worker 1 raises its error, every other rank a RuntimeError
    naming it. A checkpoint_dir the servers cannot write: a ValueError on every rank at once;
    one that goes away after it: the first server raises its OSError at its first checkpoint,
    every other rank (workers waiting for its replies among them) an error naming it. Then
    the ranks go on together."""
    first_server = hvd.size() - NUM_SERVERS
    m = model_and_data()
    ps = hvd.ParameterServerTraining(m, keras.optimizers.SGD(0.1), num_servers=NUM_SERVERS)
    m.compile(optimizer=ps.optimizer, loss="mse")

    def broken_input():
        if ps.worker_index == 1:
            raise ValueError("worker 1's input is broken")
        x, y = shard(ps.worker_index)
        return m.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)

    e = raised(lambda: ps.run(broken_input))
    if hvd.rank() == 1:
        assert type(e) is ValueError and "worker 1's input is broken" in str(e), repr(e)
    else:
        assert type(e) is RuntimeError, repr(e)
        assert "worker 1 (rank 1) raised ValueError: worker 1's input is broken" in str(e), e

    with shared_temp_dir() as folder:
        a_file = os.path.join(folder, "a_file")
        if hvd.rank() == 0:
            open(a_file, "w").close()
        hvd.barrier()
        e = raised(lambda: hvd.ParameterServerTraining(
            model_and_data(), keras.optimizers.SGD(0.1), num_servers=NUM_SERVERS,
            checkpoint_dir=os.path.join(a_file, "checkpoints")))
        assert type(e) is ValueError, repr(e)
        assert (f"server rank {first_server} cannot write checkpoint_dir "
                f"'{a_file}/checkpoints'") in str(e), e

        m = model_and_data()
        checkpoints = os.path.join(folder, "checkpoints")
        ps = hvd.ParameterServerTraining(m, keras.optimizers.SGD(0.1), num_servers=NUM_SERVERS,
                                         checkpoint_dir=checkpoints, checkpoint_every=2)
        m.compile(optimizer=ps.optimizer, loss="mse")
        hvd.barrier()
        if hvd.rank() == 0:  # the folder goes away: the servers' first checkpoint fails
            os.rmdir(checkpoints)
            open(checkpoints, "w").close()
        hvd.barrier()

        def train():
            x, y = shard(ps.worker_index)
            return m.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)

        e = raised(lambda: ps.run(train))
    if hvd.rank() == first_server:
        assert isinstance(e, OSError), repr(e)
    else:
        assert type(e) is RuntimeError, repr(e)
        assert f"server 0 (rank {first_server}) raised " in str(e), e
    after = hvd.allreduce(np.ones(2), op=hvd.Sum, name="ps_after_the_errors")
    np.testing.assert_array_equal(after, [hvd.size()] * 2)


close()
