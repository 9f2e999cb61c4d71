"""Horovod's TF1-style API on every rank: DistributedOptimizer of tf.compat.v1.train
optimizers and BroadcastGlobalVariablesHook, checked against one process training the same
graph on the global batch (every rank's batch, concatenated)."""
import tempfile

import numpy as np
import tensorflow as tf

from common import FAILED, assert_close, check, close, hvd

v1 = tf.compat.v1
N, D, V, STEPS = 8, 4, 6, 4  # per-rank batch, features, embedding rows, steps


def batch(rank):
    rng = np.random.default_rng([7, rank])
    return (rng.standard_normal((N, D)).astype(np.float32),
            rng.standard_normal((N, 1)).astype(np.float32),
            rng.integers(0, V, N).astype(np.int64))


def global_batch():
    parts = [batch(r) for r in range(hvd.size())]
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))


def initial(rank):
    """Rank-dependent starting values: only a broadcast makes the ranks agree."""
    rng = np.random.default_rng([11, rank])
    return {"w": rng.standard_normal((D, 1)).astype(np.float32),
            "b": rng.standard_normal(1).astype(np.float32),
            "emb": rng.standard_normal((V, 1)).astype(np.float32),
            "unused": rng.standard_normal(2).astype(np.float32)}


def model(data, start):
    """A linear model plus an embedding (IndexedSlices gradients) and a variable outside the
    loss (a None gradient); returns (loss, {name: variable})."""
    x, y, ids = (tf.constant(a) for a in data)
    var = {k: v1.get_variable(k, initializer=tf.constant(a)) for k, a in start.items()}
    pred = tf.matmul(x, var["w"]) + var["b"] + tf.gather(var["emb"], ids)
    return tf.reduce_mean(tf.square(pred - y)), var


def run_graph(make_optimizer, distributed, hook_root=None, use_minimize=True):
    """Train STEPS steps in a fresh graph; returns the variables' values before the first
    step and at the end."""
    data = batch(hvd.rank()) if distributed else global_batch()
    start = initial(hvd.rank() if distributed else 0)
    with tf.Graph().as_default():
        loss, var = model(data, start)
        opt = make_optimizer()
        if distributed:
            opt = hvd.DistributedOptimizer(opt)
        if use_minimize:
            train_op = opt.minimize(loss, global_step=v1.train.get_or_create_global_step())
        else:
            pairs = opt.compute_gradients(loss)
            assert dict((v.name, g) for g, v in pairs)["unused:0"] is None
            train_op = opt.apply_gradients(pairs,
                                           global_step=v1.train.get_or_create_global_step())
        final = _Final(var)
        hooks = [v1.train.StopAtStepHook(last_step=STEPS), final]
        if hook_root is not None:
            hooks.insert(0, hvd.BroadcastGlobalVariablesHook(hook_root))
        # as Horovod's README: checkpoints on rank 0 only
        with tempfile.TemporaryDirectory() as tmp:
            with v1.train.MonitoredTrainingSession(
                    checkpoint_dir=tmp if hvd.rank() == 0 and distributed else None,
                    config=v1.ConfigProto(), hooks=hooks) as sess:
                before = sess.run(var)
                while not sess.should_stop():
                    sess.run(train_op)
    return before, final.values


class _Final(v1.train.SessionRunHook):
    """Reads the variables when the session ends (after the last step)."""

    def __init__(self, var):
        self.var, self.values = var, None

    def end(self, session):
        self.values = session.run(self.var)


def _equals_one_process(make_optimizer, use_minimize):
    before, after = run_graph(make_optimizer, True, hook_root=0, use_minimize=use_minimize)
    for k, a in initial(0).items():  # the hook gave every rank rank 0's values
        assert_close(before[k], a, rtol=0, msg=k)
    _, want = run_graph(make_optimizer, False, use_minimize=use_minimize)
    for k in want:
        assert_close(after[k], want[k], rtol=2e-5, atol=1e-6, msg=k)
    assert_close(after["unused"], initial(0)["unused"], rtol=0, msg="unused")
    gathered = hvd.allgather_object({k: v.tolist() for k, v in after.items()})
    assert all(g == gathered[0] for g in gathered), "ranks differ"


@check("readme_style_adagrad_minimize_monitored_session_equals_one_process")
def _():
    _equals_one_process(lambda: v1.train.AdagradOptimizer(0.1), use_minimize=True)


@check("adam_compute_and_apply_gradients_equals_one_process")
def _():
    _equals_one_process(lambda: v1.train.AdamOptimizer(0.05), use_minimize=False)


@check("without_the_hook_ranks_keep_their_own_starting_values")
def _():
    before, _ = run_graph(lambda: v1.train.GradientDescentOptimizer(0.1), True)
    assert_close(before["w"], initial(hvd.rank())["w"], rtol=0)


@check("eager_minimize_with_a_v1_optimizer_equals_one_process")
def _():
    def train(distributed):
        x, y, _ = batch(hvd.rank()) if distributed else global_batch()
        w = tf.Variable(initial(0)["w"])
        opt = v1.train.MomentumOptimizer(0.1, 0.9)
        if distributed:
            opt = hvd.DistributedOptimizer(opt)
        for _ in range(STEPS):
            opt.minimize(lambda: tf.reduce_mean(tf.square(tf.matmul(x, w) - y)), var_list=[w])
        return w.numpy()
    assert_close(train(True), train(False), rtol=2e-5, atol=1e-6)


@check("v1_bad_inputs_give_clear_errors")
def _():
    sgd = v1.train.GradientDescentOptimizer(0.1)
    for kwargs, text in [(dict(backward_passes_per_step=2), "backward_passes_per_step"),
                         (dict(op=hvd.Adasum), "op=Adasum with a tf.compat.v1 optimizer")]:
        try:
            hvd.DistributedOptimizer(sgd, **kwargs)
            raise AssertionError(f"{kwargs}: no error")
        except ValueError as e:
            assert text in str(e), e
    try:
        hvd.DistributedOptimizer(hvd.DistributedOptimizer(sgd))
        raise AssertionError("wrapped twice: no error")
    except ValueError as e:
        assert "already distributed" in str(e), e
    try:
        hvd.BroadcastGlobalVariablesHook(0).begin()  # eager: no global variables
        raise AssertionError("hook in eager mode: no error")
    except RuntimeError as e:
        assert "tf.compat.v1 graph" in str(e), e


close()
print(f"V1_CHECKS_DONE rank={hvd.rank()} failed={FAILED}", flush=True)
