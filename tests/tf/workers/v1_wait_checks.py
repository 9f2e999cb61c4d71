"""tf.compat.v1 sessions with ONE inter-op thread running more independent collectives than
threads, which each rank starts in another order: with the asynchronous wait kernel every
result is right on every rank (with wait ops that hold the thread, the ranks stall)."""
import numpy as np
import tensorflow as tf

from common import FAILED, assert_close, check, close, hvd

v1 = tf.compat.v1
r, n = hvd.rank(), hvd.size()
ONE_THREAD = v1.ConfigProto(inter_op_parallelism_threads=1, intra_op_parallelism_threads=1)


def x_of(k, size):
    return (np.arange(size) + 10 * k + 1).astype(np.float32)


def op_types(graph):
    return {op.type for op in graph.get_operations()}


@check("named_collectives_built_in_rank_dependent_order_on_one_thread")
def _():
    names = [f"c{i}" for i in range(6)]
    order = names if r % 2 == 0 else names[::-1]  # the executor starts them in this order
    with tf.Graph().as_default() as graph:
        outs = {}
        for name in order:
            i = names.index(name)
            x = tf.constant(x_of(r, i + 1))
            if i == 2:
                outs[name] = hvd.allgather(x, name=name)
            elif i == 4:
                outs[name] = hvd.broadcast(x, root_rank=n - 1, name=name)
            else:
                outs[name] = hvd.allreduce(x, op=hvd.Sum, name=name)
        outs["scalar"] = hvd.allreduce(tf.constant(float(r)), op=hvd.Sum, name="scalar")
    assert "HvdlikeWait" in op_types(graph), sorted(op_types(graph))
    with v1.Session(graph=graph, config=ONE_THREAD) as sess:
        for _ in range(2):  # the second run is negotiated from the response cache
            got = sess.run(outs)
            for name in names:
                i = names.index(name)
                every = [x_of(k, i + 1) for k in range(n)]
                want = (np.concatenate(every) if i == 2 else every[n - 1] if i == 4
                        else np.sum(every, axis=0))
                assert_close(got[name], want, msg=name)
            assert got["scalar"].shape == () and got["scalar"] == n * (n - 1) / 2


@check("two_distributed_optimizers_with_backward_passes_in_one_run_on_one_thread")
def _():
    # each optimizer's reduction sits in a tf.cond; both in one session.run (loss sum(v^2),
    # gradient 2v on every rank, k=2, lr 0.1: two passes apply 0.6 v once)
    start = {"a": np.array([1.0, 2.0], np.float32),
             "b": np.array([[1.0], [2.0], [3.0]], np.float32)}
    with tf.Graph().as_default():
        var = {k: v1.get_variable(k, initializer=tf.constant(a)) for k, a in start.items()}
        train = [hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(0.1),
                                          backward_passes_per_step=2).minimize(
            tf.reduce_sum(tf.square(v))) for v in var.values()]
        with v1.train.MonitoredTrainingSession(config=ONE_THREAD) as sess:
            for _ in range(2):
                sess.run(train if r % 2 == 0 else train[::-1])
            got = sess.run(var)
    for k in start:
        assert_close(got[k], 0.6 * start[k], rtol=1e-6, msg=k)


@check("disagreements_and_bad_input_keep_their_tensorflow_error_classes")
def _():
    if n == 1:
        return
    with tf.Graph().as_default() as graph:
        mismatched = hvd.allreduce(tf.zeros([r + 1, 2]), name="mismatched")
        bad_splits = hvd.alltoall(tf.zeros([4]), splits=[3] + [0] * (n - 1) if r == 0 else
                                  [1] * n, name="bad_splits")
        fine = hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="fine")
    with v1.Session(graph=graph, config=ONE_THREAD) as sess:
        for fetch, error, text in (
                (mismatched, tf.errors.FailedPreconditionError,
                 "shape: rank 0 has (1, 2), rank 1 has (2, 2)"),
                (bad_splits, tf.errors.InvalidArgumentError, "splits")):
            try:
                sess.run(fetch)
            except error as e:
                assert type(e) is error and text in e.message, (type(e), e.message)
            else:
                raise AssertionError(f"{fetch.name}: no error")
        assert_close(sess.run(fine), np.full(2, n, np.float32))  # the session goes on


@check("a_run_timeout_ends_a_wait_that_other_ranks_have_not_joined")
def _():
    if n == 1:
        return
    with tf.Graph().as_default() as graph:
        late = hvd.allreduce(tf.constant(x_of(r, 3)), op=hvd.Sum, name="late")
        barrier = hvd.barrier()
    want = np.sum([x_of(k, 3) for k in range(n)], axis=0)
    with v1.Session(graph=graph, config=ONE_THREAD) as sess:
        if r == 0:  # alone: the run's timeout cancels the step, whose wait op ends at once
            try:
                sess.run(late, options=v1.RunOptions(timeout_in_ms=1000))
            except tf.errors.DeadlineExceededError:
                pass
            else:
                raise AssertionError("no DeadlineExceededError")
        sess.run(barrier)
        if r != 0:  # rank 0's request is still with its engine: these runs complete with it
            assert_close(sess.run(late), want)
        sess.run(barrier)
        for _ in range(2):  # the session goes on
            assert_close(sess.run(late), want)


close()
print(f"V1_WAIT_CHECKS_DONE rank={hvd.rank()} failed={FAILED}", flush=True)
