"""Horovod's TF1-style API on every rank: DistributedOptimizer of tf.compat.v1.train
optimizers and BroadcastGlobalVariablesHook, checked against one process training the same
graph on the global batch (every rank's batch, concatenated)."""
import sys
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf

from common import FAILED, assert_close, check, close, hvd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the NumPy references
import reference  # noqa: E402

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


def train_passes(passes, distributed, bpps=1, average=False, applied_scale=1.0):
    """``passes`` passes of Momentum (which, unlike Adam, sees the gradients' scale) in a
    graph under a MonitoredTrainingSession; distributed: rank 0's values broadcast and
    ``DistributedOptimizer(backward_passes_per_step=bpps)``; otherwise one process on the
    global batch applying ``applied_scale`` times the (dense) gradient on every bpps-th pass
    only. Returns the final values and the global step."""
    data = batch(hvd.rank()) if distributed else global_batch()
    with tf.Graph().as_default():
        loss, var = model(data, initial(0 if not distributed else hvd.rank()))
        step = v1.train.get_or_create_global_step()
        opt = v1.train.MomentumOptimizer(0.05, 0.9)
        if distributed:
            opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=bpps,
                                           average_aggregated_gradients=average)
            pairs = opt.compute_gradients(loss)
            assert dict((v.name, g) for g, v in pairs)["unused:0"] is None
            train_op = opt.apply_gradients(pairs, global_step=step)
            hooks = [hvd.BroadcastGlobalVariablesHook(0)]
        else:
            pairs = [(None if g is None else applied_scale * tf.convert_to_tensor(g), v)
                     for g, v in opt.compute_gradients(loss)]
            now = tf.equal(step.assign_add(1) % bpps, 0)
            train_op = tf.cond(now, lambda: tf.group(opt.apply_gradients(pairs)), tf.no_op)
            hooks = []
        final = _Final({**var, "step": step})
        hooks += [v1.train.StopAtStepHook(last_step=passes), final]
        with v1.train.MonitoredTrainingSession(hooks=hooks) as sess:
            while not sess.should_stop():
                sess.run(train_op)
    return final.values


@check("backward_passes_per_step_sums_locally_and_applies_every_kth_pass_like_one_process")
def _():
    # 5 passes, k=2: applied after passes 2 and 4, not after 5; the batch is the same on
    # every pass, so each application is of 2x (or, averaged, 1x) the global-batch gradient
    for average, scale in [(False, 2.0), (True, 1.0)]:
        got = train_passes(5, True, bpps=2, average=average)
        want = train_passes(5, False, bpps=2, applied_scale=scale)
        assert got["step"] == 5 == want["step"], (got["step"], want["step"])
        for k in ("w", "b", "emb"):
            assert_close(got[k], want[k], rtol=2e-5, atol=1e-6, msg=f"{k} average={average}")
        assert_close(got["unused"], initial(0)["unused"], rtol=0, msg="unused")
        assert not np.allclose(got["w"], initial(0)["w"]), "nothing was applied"


@check("eager_backward_passes_per_step_applies_every_kth_pass")
def _():
    x, y, _ = batch(hvd.rank())
    w = tf.Variable(initial(0)["w"])
    opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(0.1),
                                   backward_passes_per_step=3)
    seen = []
    for _ in range(6):
        opt.minimize(lambda: tf.reduce_mean(tf.square(tf.matmul(x, w) - y)), var_list=[w])
        seen.append(w.numpy().copy())
    start = initial(0)["w"]
    assert_close(seen[0], start, rtol=0, msg="pass 1")
    assert_close(seen[1], start, rtol=0, msg="pass 2")
    assert not np.allclose(seen[2], start), "pass 3 applied nothing"
    assert_close(seen[3], seen[2], rtol=0, msg="pass 4")
    gx, gy, _ = global_batch()  # one application: 3x the global-batch gradient at start
    grad = 2 * gx.T @ (gx @ start - gy) / len(gx)
    assert_close(seen[2], start - 0.1 * 3 * grad, rtol=2e-5, atol=1e-6, msg="pass 3")


def gradients(value, data):
    """NumPy: the model's gradients (dense; the embedding's rows that the batch uses are
    ``rows``) at ``value`` on ``data``."""
    x, y, ids = (a.astype(np.float64) if a.dtype != np.int64 else a for a in data)
    d = 2 * (x @ value["w"] + value["b"] + value["emb"][ids] - y) / len(x)
    emb = np.zeros_like(value["emb"])
    np.add.at(emb, ids, d)
    return {"w": x.T @ d, "b": d.sum(0), "emb": emb}, np.unique(ids)


def adasum_reference(passes, bpps, momentum):
    """NumPy: what Horovod's TF1 Adasum optimizer gives this rank after ``passes`` passes of
    SGD (lr 0.1, with ``momentum``: TF1 Momentum, whose sparse update leaves the rows a batch
    does not use alone) from rank 0's values: every rank steps on its own batch, and every
    bpps-th pass every rank's change since the last combination is combined by Adasum."""
    trained = ("w", "b", "emb")
    value = [{k: initial(0)[k].astype(np.float64) for k in trained} for _ in range(hvd.size())]
    slot = [{k: np.zeros_like(a) for k, a in v.items()} for v in value]
    start = {k: a.copy() for k, a in value[0].items()}
    for p in range(1, passes + 1):
        for r in range(hvd.size()):
            grad, rows = gradients(value[r], batch(r))
            for k in trained:
                used = rows if k == "emb" else slice(None)
                slot[r][k][used] = momentum * slot[r][k][used] + grad[k][used]
                value[r][k][used] -= 0.1 * slot[r][k][used]
        if p % bpps == 0:
            for k in trained:
                start[k] = start[k] + reference.adasum([v[k] - start[k] for v in value])
                for v in value:
                    v[k] = start[k].copy()
    return value[hvd.rank()]


@check("adasum_combines_the_updates_every_kth_pass_like_horovod")
def _():
    # a graph under a MonitoredTrainingSession, rank 0's values broadcast by the hook; the
    # last of 5 passes with k=2 is not combined: there the ranks hold their own values
    for momentum, passes, bpps in [(0.0, 3, 1), (0.9, 5, 2)]:
        data = batch(hvd.rank())
        with tf.Graph().as_default():
            loss, var = model(data, initial(hvd.rank()))
            step = v1.train.get_or_create_global_step()
            opt = v1.train.MomentumOptimizer(0.1, momentum)
            opt = hvd.DistributedOptimizer(opt, op=hvd.Adasum, backward_passes_per_step=bpps)
            train_op = opt.minimize(loss, global_step=step)
            final = _Final({**var, "step": step})
            hooks = [hvd.BroadcastGlobalVariablesHook(0),
                     v1.train.StopAtStepHook(last_step=passes), final]
            with v1.train.MonitoredTrainingSession(hooks=hooks) as sess:
                while not sess.should_stop():
                    sess.run(train_op)
        got, want = final.values, adasum_reference(passes, bpps, momentum)
        assert got["step"] == passes, got["step"]
        for k in want:
            assert_close(got[k], want[k], rtol=1e-4, atol=1e-5, msg=f"{k} k={bpps}")
        assert_close(got["unused"], initial(0)["unused"], rtol=0, msg="unused")
        assert not np.allclose(got["w"], initial(0)["w"]), "nothing was applied"


@check("eager_adasum_with_a_v1_optimizer_combines_every_pass")
def _():
    x, y, ids = batch(hvd.rank())
    var = {k: tf.Variable(a) for k, a in initial(0).items() if k != "unused"}
    opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(0.1), op=hvd.Adasum)
    for _ in range(2):
        opt.minimize(lambda: tf.reduce_mean(tf.square(
            tf.matmul(x, var["w"]) + var["b"] + tf.gather(var["emb"], ids) - y)),
            var_list=list(var.values()))
    want = adasum_reference(2, 1, 0.0)
    for k, v in var.items():
        assert_close(v.numpy(), want[k], rtol=1e-4, atol=1e-5, msg=k)


@check("two_optimizers_with_backward_passes_in_one_graph_keep_their_own_state")
def _():
    # loss sum(v^2): the same gradient 2v on every rank; two passes with k=2 and lr 0.1:
    # Average applies the sum of both passes' gradients once (0.6 v); Adasum steps each pass
    # (0.8 * 0.8 v) and combines equal changes, which leaves them as they are
    for op, factor in ((hvd.Average, 0.6), (hvd.Adasum, 0.64)):
        start = {"a": np.array([1.0, 2.0], np.float32),
                 "b": np.array([[1.0], [2.0], [3.0]], np.float32)}
        with tf.Graph().as_default():
            var = {k: v1.get_variable(k, initializer=tf.constant(a)) for k, a in start.items()}
            train = [hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(0.1), op=op,
                                              backward_passes_per_step=2).minimize(
                tf.reduce_sum(tf.square(v))) for v in var.values()]
            with v1.train.MonitoredTrainingSession() as sess:
                for _ in range(2):
                    for t in train:  # one at a time: see "inter-op threads" in tensorflow.md
                        sess.run(t)
                got = sess.run(var)
        for k in start:
            assert_close(got[k], factor * start[k], rtol=1e-6, msg=f"{k} {op}")


@check("v1_bad_inputs_give_clear_errors")
def _():
    sgd = v1.train.GradientDescentOptimizer(0.1)
    for kwargs, text in [(dict(backward_passes_per_step=0), "backward_passes_per_step"),
                         (dict(op=hvd.Adasum, average_aggregated_gradients=True),
                          "average_aggregated_gradients is not supported with op=Adasum")]:
        try:
            hvd.DistributedOptimizer(sgd, **kwargs)
            raise AssertionError(f"{kwargs}: no error")
        except ValueError as e:
            assert text in str(e), e
    for op in (hvd.Average, hvd.Adasum):
        try:
            hvd.DistributedOptimizer(hvd.DistributedOptimizer(sgd, op=op))
            raise AssertionError(f"wrapped twice ({op}): no error")
        except ValueError as e:
            assert "already distributed" in str(e), e
    try:
        hvd.DistributedOptimizer(sgd, op=hvd.Adasum).register_local_var(tf.Variable([1.0]))
        raise AssertionError("register_local_var with Adasum: no error")
    except ValueError as e:
        assert "register_local_var is not supported" in str(e), e
    w = tf.Variable([1.0])
    try:
        hvd.DistributedOptimizer(sgd, backward_passes_per_step=2).apply_gradients(
            [(tf.constant([1.0]), w)])
        raise AssertionError("apply_gradients before compute_gradients: no error")
    except RuntimeError as e:
        assert "compute_gradients (or minimize) before apply_gradients" in str(e), e
    try:
        hvd.BroadcastGlobalVariablesHook(0).begin()  # eager: no global variables
        raise AssertionError("hook in eager mode: no error")
    except RuntimeError as e:
        assert "tf.compat.v1 graph" in str(e), e


close()
print(f"V1_CHECKS_DONE rank={hvd.rank()} failed={FAILED}", flush=True)
