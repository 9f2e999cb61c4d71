"""TensorFlow's side of the GPU path, checked where there is no GPU (TensorFlow does not run on
the lent GPU machine): device detection, the hand-over of eager CPU tensors to the core and
back, and pin_gpu on a machine without GPUs."""
import numpy as np
import tensorflow as tf

from hvdlike.tensorflow import devices


def test_cpu_tensors_and_variables_are_not_on_a_gpu():
    assert not devices.on_gpu(tf.constant([1.0, 2.0]))
    assert not devices.on_gpu(tf.Variable([1.0]))
    assert not devices.on_gpu(np.ones(2))


def test_device_names_with_a_gpu_are_recognised():
    assert devices.is_gpu_device("/job:localhost/replica:0/task:0/device:GPU:1")
    assert devices.is_gpu_device("/device:gpu:0")
    assert not devices.is_gpu_device(tf.constant(1.0).device)
    assert not devices.is_gpu_device("/job:worker/replica:0/task:1/device:CPU:0")


def test_eager_cpu_tensors_reach_the_core_without_a_copy_and_come_back_as_tensors():
    t = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    core = devices.to_core(t)
    assert isinstance(core, np.ndarray) and core.dtype == np.float32
    np.testing.assert_array_equal(core, t.numpy())
    assert np.shares_memory(core, np.asarray(t))
    back = devices.from_core(core * 2, tf.float32)
    assert isinstance(back, tf.Tensor) and back.dtype == tf.float32
    np.testing.assert_array_equal(back.numpy(), t.numpy() * 2)


def test_pin_gpu_without_gpus_changes_nothing():
    before = tf.config.get_visible_devices()
    assert devices.pin_gpu(0) is None and devices.pin_gpu(3) is None
    assert tf.config.get_visible_devices() == before
