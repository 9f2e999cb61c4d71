"""The top-level ``hvdlike`` collectives hand TensorFlow values to the TF frontend."""
import sys

import numpy as np
import tensorflow as tf

import hvdlike as hvd
from common import assert_close, check, close

rank, size = hvd.rank(), hvd.size()


@check("toplevel_allreduce_tensor")
def _():
    out = hvd.allreduce(tf.constant([1.0, 2.0]) * (rank + 1), op=hvd.Sum)
    assert tf.is_tensor(out), type(out)
    assert_close(out, np.array([1.0, 2.0]) * size * (size + 1) / 2)


@check("toplevel_grouped_allreduce_variables")
def _():
    out = hvd.grouped_allreduce([tf.Variable([float(rank)]), tf.ones(2)], op=hvd.Average)
    assert all(tf.is_tensor(o) for o in out)
    assert_close(out[0], [(size - 1) / 2])
    assert_close(out[1], [1.0, 1.0])


@check("toplevel_broadcast_and_allgather_in_tf_function")
def _():
    @tf.function
    def step(x):
        return hvd.broadcast(x, root_rank=0), hvd.allgather(x)

    b, g = step(tf.fill([2], float(rank)))
    assert_close(b, [0.0, 0.0])
    assert_close(g, np.repeat(np.arange(size, dtype=np.float32), 2))


@check("toplevel_numpy_stays_numpy")
def _():
    out = hvd.allreduce(np.ones(2), op=hvd.Sum)
    assert isinstance(out, np.ndarray) and out.tolist() == [size, size]


@check("toplevel_lazy_tf_names")
def _():
    assert hvd.DistributedOptimizer is sys.modules["hvdlike.tensorflow"].DistributedOptimizer
    assert hvd.BroadcastGlobalVariablesCallback.__module__ == "hvdlike.tensorflow.keras.callbacks"


close()
