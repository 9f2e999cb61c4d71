"""Horovod's ``horovod.tensorflow.util`` helper that ported scripts and tests call."""
import tensorflow as tf


def _executing_eagerly() -> bool:
    """True when TensorFlow runs eagerly here (False in a ``tf.compat.v1`` graph and while
    a ``tf.function`` is traced), as ``horovod.tensorflow.util._executing_eagerly``."""
    return tf.executing_eagerly()
