"""Without the wait kernel (it cannot be built here) a v1 graph keeps numpy_function wait ops:
with as many inter-op threads as collectives, results are still right on every rank."""
import tensorflow as tf

from common import FAILED, assert_close, check, close, hvd

r, n = hvd.rank(), hvd.size()


@check("v1_graph_without_the_wait_kernel")
def _():
    names = ["a", "b"] if r % 2 == 0 else ["b", "a"]
    with tf.Graph().as_default() as graph:
        outs = {k: hvd.allreduce(tf.constant([float(r + 1)]), op=hvd.Sum, name=k) for k in names}
    types = {op.type for op in graph.get_operations()}
    assert "HvdlikeWait" not in types and "PyFuncStateless" in types, sorted(types)
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        got = sess.run(outs)
    for k in names:
        assert_close(got[k], [n * (n + 1) / 2], msg=k)


close()
print(f"V1_WAIT_FALLBACK_DONE rank={hvd.rank()} failed={FAILED}", flush=True)
