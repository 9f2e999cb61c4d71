"""How a graph all-reduce's tensors cross into Python (hvdlike.tensorflow.packing), in-process."""
import numpy as np
import tensorflow as tf

from hvdlike import ReduceOp
from hvdlike.tensorflow.packing import PACK_BYTES, Packing

BIG = (PACK_BYTES // 4 + 1,)  # float32: just over the packing limit


def _tensors():
    specs = [((2, 3), tf.float32), ((), tf.float32), (BIG, tf.float32), ((4,), tf.float64),
             ((0,), tf.float32), ((5,), tf.int32), ((2, 2), tf.float64)]
    return [tf.reshape(tf.cast(tf.range(int(np.prod(s))), d), s) for s, d in specs]


def test_small_tensors_of_one_dtype_share_a_slot_large_and_lone_ones_cross_alone():
    assert Packing(_tensors(), ReduceOp.SUM).slots == [[0, 1, 4], [2], [3, 6], [5]]


def test_adasum_and_unknown_shapes_are_not_packed():
    assert Packing(_tensors(), ReduceOp.ADASUM).slots == [[i] for i in range(7)]
    seen = []

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)] * 2
                 + [tf.TensorSpec([3], tf.float32)] * 2)
    def build(a, b, c, d):
        seen.append(Packing([a, b, c, d], ReduceOp.SUM).slots)
        return a
    build.get_concrete_function()
    assert seen == [[[0], [1], [2, 3]]]


def test_what_crosses_comes_back_in_each_tensors_shape_and_values():
    tensors = _tensors()
    packing = Packing(tensors, ReduceOp.SUM)
    crossing = packing.pack(tensors)
    assert [c.shape.as_list() for c in crossing] == [[7], list(BIG), [8], [5]]
    np.testing.assert_array_equal(crossing[0].numpy(), [0, 1, 2, 3, 4, 5, 0])
    np.testing.assert_array_equal(crossing[2].numpy(), [0, 1, 2, 3, 0, 1, 2, 3])
    back = packing.unpack([2 * c for c in crossing])  # the engine's results: one per slot
    for b, t in zip(back, tensors):
        assert b.shape == t.shape and b.dtype == t.dtype
        np.testing.assert_array_equal(b.numpy(), 2 * t.numpy())


def test_the_request_names_the_shapes_each_crossing_tensor_carries():
    assert Packing(_tensors(), ReduceOp.SUM).parts == (((2, 3), (), (0,)), None, ((4,), (2, 2)),
                                                       None)
    assert Packing(_tensors(), ReduceOp.ADASUM).parts is None  # nothing packed
